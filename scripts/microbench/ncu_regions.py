# Decode step 23 (docs/perf-notes.md): ncu warp-state samples of one kernel by code region.
# Usage: python3 ncu_regions.py SRC.csv (ncu -i REP --page source --csv --print-source sass).
# The region bounds B are offsets into the SASS of flash_fwd_tc_dec_bf16_d128_w8_bc128_s3_c as
# the H100 driver compiled it in session 9 call 1 (loop: the first barrier of the main loop;
# merge: the barrier after it; count: the MEMBAR; combine: after the count's barrier; ool:
# out-of-line code). Another build moves them: read them off the SASS first.
import csv,sys
f=sys.argv[1]
rows=list(csv.reader(open(f)))
hdr=rows[1]; data=rows[2:]
ia=hdr.index('Address'); isrc=hdr.index('Source'); iall=hdr.index('Warp Stall Sampling (All Samples)'); iex=hdr.index('Instructions Executed')
reasons=[h for h in hdr if h.startswith('stall_') and 'Not Issued' not in h]
ir={r:hdr.index(r) for r in reasons}
def num(x):
    try: return float(x)
    except: return 0.0
B=[0,0x81f0,0xfe70,0x117d0,0x11a20,0x159d0,1<<62]
names=['prologue','loop','merge+store','count','combine','ool']
base=int(data[0][ia],16)
tot={}; allsum=0; exe={}
for r in data:
    a=int(r[ia],16)-base
    s=num(r[iall]); allsum+=s
    for i,n in enumerate(names):
        if B[i]<=a<B[i+1]:
            d=tot.setdefault(n,{'all':0}); d['all']+=s; exe[n]=exe.get(n,0)+num(r[iex])
            for k,j in ir.items(): d[k]=d.get(k,0)+num(r[j])
print(f,'total',allsum)
for n in names:
    d=tot.get(n)
    if not d: continue
    top=sorted(((v,k) for k,v in d.items() if k!='all'),reverse=True)[:6]
    print(f"  {n:12s} {d['all']:6.0f} ({100*d['all']/allsum:5.1f}%) inst {exe[n]:9.0f} |", ', '.join(f"{k[6:]} {v:.0f}" for v,k in top))
