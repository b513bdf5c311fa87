"""The conversation trace as conversations: a request continues the one that
last used the longest prefix it shares (beyond the root block).  Prints,
per turn, how often a conversation goes on and the gap to its next turn;
how well the previous gap predicts the next (correlation of the logs);
and the same against input and output lengths.

usage: conversation_turns.py ../shared/traces/conversation_trace.jsonl"""
import json,sys,collections,math
f=sys.argv[1]
recs=[json.loads(l) for l in open(f) if l.strip()]
recs.sort(key=lambda r:r["timestamp"])
# conversation parent: previous request containing ids[k-1] for the longest known prefix k>=2 (beyond root)
owner={}  # block -> last request index using it
par=[None]*len(recs)
for i,r in enumerate(recs):
    ids=r["hash_ids"]; k=0
    while k<len(ids) and ids[k] in owner: k+=1
    if k>=2: par[i]=(owner[ids[k-1]],k)
    for h in ids: owner[h]=i
ch=collections.defaultdict(list)
for i,p in enumerate(par):
    if p: ch[p[0]].append(i)
# per request: turn number, gap to parent (ms), gap to first child
turn=[0]*len(recs)
for i,p in enumerate(par):
    if p: turn[i]=turn[p[0]]+1
rows=[]
for i,r in enumerate(recs):
    c=ch.get(i,[])
    g=(recs[c[0]]["timestamp"]-r["timestamp"]) if c else None
    pg=(r["timestamp"]-recs[par[i][0]]["timestamp"]) if par[i] else None
    rows.append((turn[i],pg,g,r["input_length"],r["output_length"],len(c), par[i][1] if par[i] else 0, len(r["hash_ids"])))
print("requests",len(rows),"with children",sum(1 for x in rows if x[5]),"multi-children",sum(1 for x in rows if x[5]>1))
by=collections.defaultdict(list)
for t,pg,g,il,ol,nc,k,n in rows: by[min(t,6)].append(g)
for t in sorted(by):
    a=by[t]; c=[x for x in a if x is not None]; c.sort()
    print("turn",t,"n",len(a),"P(child)=%.2f"%(len(c)/len(a)), "gap ms p25/50/75",c[len(c)//4] if c else -1,c[len(c)//2] if c else -1,c[3*len(c)//4] if c else -1)
# prev gap vs next gap
pairs=[(pg,g) for t,pg,g,il,ol,nc,k,n in rows if pg is not None and g is not None]
import statistics
lp=[math.log(x+1) for x,_ in pairs]; lg=[math.log(y+1) for _,y in pairs]
print("pairs",len(pairs),"corr log prevgap vs log nextgap %.3f"%statistics.correlation(lp,lg))
b=collections.defaultdict(list)
for pg,g in pairs: b[int(math.log2(pg+1))].append(g)
for k in sorted(b):
    a=sorted(b[k]); print(" prevgap 2^%d ms"%k,len(a),"next p25/50/75",a[len(a)//4],a[len(a)//2],a[3*len(a)//4])
# P(child) vs prev gap
b=collections.defaultdict(lambda:[0,0])
for t,pg,g,il,ol,nc,k,n in rows:
    if pg is not None: b[int(math.log2(pg+1))][0]+=1; b[int(math.log2(pg+1))][1]+= g is not None
print("P(child | prevgap bucket):",{k:"%.2f/%d"%(v[1]/v[0],v[0]) for k,v in sorted(b.items())})
# gap vs output_length, input length
for name,ix in (("outlen",4),("inlen",3)):
    b=collections.defaultdict(list); pc=collections.defaultdict(lambda:[0,0])
    for row in rows:
        key=int(math.log2(row[ix]+1)); pc[key][0]+=1; pc[key][1]+=row[2] is not None
        if row[2] is not None: b[key].append(row[2])
    for k in sorted(b):
        a=sorted(b[k]); print(" %s 2^%d"%(name,k),len(a),"P(child)=%.2f"%(pc[k][1]/pc[k][0]),"gap p25/50/75",a[len(a)//4],a[len(a)//2],a[3*len(a)//4])
