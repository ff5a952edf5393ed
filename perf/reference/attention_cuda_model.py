#!/usr/bin/env python3
# Host model of the bf16 CUDA attention kernels (src/kernels/attention/attention_cuda_bf16.cpp), for
# reviewing changes to them on a machine without a GPU (numpy only; not run by CI):
#  1. the register-fragment patterns the kernels use, with ldmatrix and mma.m16n8k16 emulated
#     per lane from the PTX ISA's definitions and the kernels' address helpers (a_addr,
#     bn_addr, bk_addr, c_to_a) transcribed: A by ldmatrix x B by ldmatrix (S = Q K^T), and
#     A from C fragments x B by ldmatrix.trans (O = P V);
#  2. the kernels' control flow per warp (tile bounds, skipped tiles, masks, ragged T, lse = +inf
#     for padded queries, D in dqkv's q slot), in float64 against dense causal attention.
# Both print max errors at rounding level (~1e-14 or below) when the kernels' logic is right.
import numpy as np

print("fragment patterns:")
rng=np.random.default_rng(0)
# PTX semantics. ldmatrix x4: lanes 8i..8i+7 give row addresses (r, c) of matrix i (8 consecutive cols).
def ldmatrix_x4(S, addr, trans=False):
    # addr: list of 32 (row, col) ; returns regs[lane][i] = (lo, hi)
    mats=[np.array([S[addr[8*i+j][0], addr[8*i+j][1]:addr[8*i+j][1]+8] for j in range(8)]) for i in range(4)]
    regs=[[None]*4 for _ in range(32)]
    for l in range(32):
        for i in range(4):
            M=mats[i]
            if not trans: regs[l][i]=(M[l//4,2*(l%4)], M[l//4,2*(l%4)+1])
            else: regs[l][i]=(M[2*(l%4),l//4], M[2*(l%4)+1,l//4])
    return regs
def mma(c, a, b):
    # c[lane][4], a[lane][4] pairs, b[lane][2] pairs ; m16n8k16 row.col
    A=np.zeros((16,16)); B=np.zeros((16,8)); C=np.zeros((16,8))
    for l in range(32):
        g,t=l//4,l%4
        A[g,2*t:2*t+2]=a[l][0]; A[g+8,2*t:2*t+2]=a[l][1]; A[g,2*t+8:2*t+10]=a[l][2]; A[g+8,2*t+8:2*t+10]=a[l][3]
        B[2*t:2*t+2,g]=b[l][0]; B[2*t+8:2*t+10,g]=b[l][1]
        C[g,2*t:2*t+2]=c[l][0:2]; C[g+8,2*t:2*t+2]=c[l][2:4]
    C=C+A@B
    for l in range(32):
        g,t=l//4,l%4
        c[l]=[C[g,2*t],C[g,2*t+1],C[g+8,2*t],C[g+8,2*t+1]]
# the kernel's address helpers (return (row, col))
def a_addr(r0,c0,lane): return (r0+(lane&15), c0+(lane>>4)*8)
def bn_addr(n0,k0,lane): return (n0+(lane&7)+(lane>>4)*8, k0+((lane>>3)&1)*8)
def bk_addr(k0,n0,lane): return (k0+(lane&7)+((lane>>3)&1)*8, n0+(lane>>4)*8)
def c_to_a(lo,hi): return [(lo[0],lo[1]),(lo[2],lo[3]),(hi[0],hi[1]),(hi[2],hi[3])]

D=64; BN=64; W=1  # warp 1 of the block: rows 16..31
Q=rng.standard_normal((64,D)); K=rng.standard_normal((BN,D)); V=rng.standard_normal((BN,D))
qf=[ [tuple(x) for x in ldmatrix_x4(Q,[a_addr(16*W,16*kk,l) for l in range(32)])] for kk in range(D//16)]
qf=[[qf[kk][l] for kk in range(D//16)] for l in range(32)]  # qf[lane][kk][4]
s=[[ [0.0]*4 for _ in range(BN//8)] for l in range(32)]
for kk in range(D//16):
    for np_ in range(BN//16):
        kf=ldmatrix_x4(K,[bn_addr(16*np_,16*kk,l) for l in range(32)])
        c0=[s[l][2*np_] for l in range(32)]; c1=[s[l][2*np_+1] for l in range(32)]
        mma(c0,[qf[l][kk] for l in range(32)],[(kf[l][0],kf[l][1]) for l in range(32)])
        mma(c1,[qf[l][kk] for l in range(32)],[(kf[l][2],kf[l][3]) for l in range(32)])
        for l in range(32): s[l][2*np_]=c0[l]; s[l][2*np_+1]=c1[l]
Sref=Q[16*W:16*W+16]@K.T
S=np.zeros((16,BN))
for l in range(32):
    g,t=l//4,l%4
    for nt in range(BN//8):
        for e in range(4): S[g+8*(e>>1), 8*nt+2*t+(e&1)]=s[l][nt][e]
print("S = Q K^T  max err", abs(S-Sref).max())
# O = S V using c_to_a and bk_addr trans
o=[[[0.0]*4 for _ in range(D//8)] for l in range(32)]
for kk in range(BN//16):
    pa=[c_to_a(s[l][2*kk],s[l][2*kk+1]) for l in range(32)]
    for dp in range(D//16):
        vf=ldmatrix_x4(V,[bk_addr(16*kk,16*dp,l) for l in range(32)],trans=True)
        c0=[o[l][2*dp] for l in range(32)]; c1=[o[l][2*dp+1] for l in range(32)]
        mma(c0,pa,[(vf[l][0],vf[l][1]) for l in range(32)]); mma(c1,pa,[(vf[l][2],vf[l][3]) for l in range(32)])
        for l in range(32): o[l][2*dp]=c0[l]; o[l][2*dp+1]=c1[l]
O=np.zeros((16,D))
for l in range(32):
    g,t=l//4,l%4
    for dt in range(D//8):
        O[g,8*dt+2*t:8*dt+2*t+2]=o[l][dt][0:2]; O[g+8,8*dt+2*t:8*dt+2*t+2]=o[l][dt][2:4]
print("O = S V    max err", abs(O-Sref@V).max())

print("control flow (T, HS, relative max errors):")
def dense(Q,K,V,dO):
    T,D=Q.shape; s=Q@K.T/np.sqrt(D); s[np.triu(np.ones((T,T),bool),1)]=-np.inf
    m=s.max(1,keepdims=True); P=np.exp(s-m); l=P.sum(1,keepdims=True); P/=l
    O=P@V; lse=(m+np.log(l))[:,0]
    dP=dO@V.T; Dv=(dO*O).sum(1); dS=P*(dP-Dv[:,None])
    return O,lse,dS@K/np.sqrt(D),dS.T@Q/np.sqrt(D),P.T@dO,Dv
def pad(X,n): Y=np.zeros((n,X.shape[1])); Y[:min(n,len(X))]=X[:n]; return Y
def fwd(Q,K,V,kWarps,BN=64):
    T,D=Q.shape; BM=16*kWarps; sl=1/np.sqrt(D)*np.log2(np.e)
    O=np.full((T,D),np.nan); lse=np.full(T,np.nan)
    for qb in range((T+BM-1)//BM):
        m0=qb*BM; nkb=(min(m0+BM,T)-1)//BN+1
        Qt=pad(Q[m0:],BM)
        for w in range(kWarps):
            r0=m0+16*w; q=Qt[16*w:16*w+16]; mrow=np.full(16,-np.inf); l=np.zeros(16); o=np.zeros((16,D))
            for kb in range(nkb):
                n0=kb*BN
                if n0>r0+15: continue
                Kt=pad(K[n0:],BN); Vt=pad(V[n0:],BN)
                s=(q@Kt.T)*sl
                if n0+BN-1>r0 or n0+BN>T:
                    key=n0+np.arange(BN)[None,:]; row=r0+np.arange(16)[:,None]
                    s[(key>row)|(key>=T)]=-np.inf
                mnew=np.maximum(mrow,s.max(1)); ms=np.where(mnew==-np.inf,0,mnew)
                corr=np.exp2(mrow-ms); mrow=mnew; l*=corr; o*=corr[:,None]
                p=np.exp2(s-ms[:,None]); l+=p.sum(1); o+=p@Vt
            for i in range(16):
                if r0+i<T: O[r0+i]=o[i]/l[i]; lse[r0+i]=(mrow[i]+np.log2(l[i]))*np.log(2)
    return O,lse
def bwd(Q,K,V,dO,O,lse,kWarps=4,BQ=64,BNq=64):
    T,D=Q.shape; sc=1/np.sqrt(D); sl=sc*np.log2(np.e)
    dQ=np.full((T,D),np.nan); dK=np.full((T,D),np.nan); dV=np.full((T,D),np.nan)
    Dslot=(dO*O).sum(1)  # row_dot into q slot
    BN=16*kWarps
    for kb in range((T+BN-1)//BN):
        n0=kb*BN; Kt=pad(K[n0:],BN); Vt=pad(V[n0:],BN)
        for w in range(kWarps):
            j0=n0+16*w; dk=np.zeros((16,D)); dv=np.zeros((16,D))
            for qb in range(n0//BQ,(T+BQ-1)//BQ):
                q0=qb*BQ
                if q0+BQ-1<j0: continue
                Qt=pad(Q[q0:],BQ); Ot=pad(dO[q0:],BQ)
                L=np.array([lse[q0+i]*np.log2(np.e) if q0+i<T else np.inf for i in range(BQ)])
                Dd=np.array([Dslot[q0+i] if q0+i<T else 0 for i in range(BQ)])
                s=Kt[16*w:16*w+16]@Qt.T; dp=Vt[16*w:16*w+16]@Ot.T
                p=np.exp2(s*sl-L[None,:])
                if q0<j0+15:
                    qq=q0+np.arange(BQ)[None,:]; kk=j0+np.arange(16)[:,None]; p[qq<kk]=0
                ds=p*(dp-Dd[None,:]); dv+=p@Ot; dk+=ds@Qt
            for i in range(16):
                if j0+i<T: dK[j0+i]=dk[i]*sc; dV[j0+i]=dv[i]
    BM=16*kWarps; BN=BNq
    for qb in range((T+BM-1)//BM):
        m0=qb*BM; nkb=(min(m0+BM,T)-1)//BN+1; Qt=pad(Q[m0:],BM); Ot=pad(dO[m0:],BM)
        for w in range(kWarps):
            r0=m0+16*w; rows=r0+np.arange(16)
            L=np.array([lse[r]*np.log2(np.e) if r<T else np.inf for r in rows]); Dd=np.array([Dslot[r] if r<T else 0 for r in rows])
            dq=np.zeros((16,D))
            for kb in range(nkb):
                n0=kb*BN
                if n0>r0+15: continue
                Kt=pad(K[n0:],BN); Vt=pad(V[n0:],BN)
                s=Qt[16*w:16*w+16]@Kt.T; dp=Ot[16*w:16*w+16]@Vt.T
                p=np.exp2(s*sl-L[:,None])
                if n0+BN-1>r0 or n0+BN>T:
                    key=n0+np.arange(BN)[None,:]; p[(key>rows[:,None])|(key>=T)]=0
                dq+=(p*(dp-Dd[:,None]))@Kt
            for i in range(16):
                if rows[i]<T: dQ[rows[i]]=dq[i]*sc
    return dQ,dK,dV
for T,D in [(77,64),(200,32),(333,128),(1024,64),(1,64),(64,64),(65,32)]:
    Q,K,V,dO=(rng.uniform(-2,2,(T,D)) for _ in range(4))
    Or,lr,dQr,dKr,dVr,_=dense(Q,K,V,dO)
    kW=8 if D<=64 else 4
    O,lse=fwd(Q,K,V,kW)
    BQ=64 if D<=64 else 32
    dQ,dK,dV=bwd(Q,K,V,dO,O,lse,4,BQ,BQ)
    e=lambda a,b: np.abs(a-b).max()/np.abs(b).max()
    print(T,D,"O",e(O,Or),"lse",e(lse,lr),"dQ",e(dQ,dQr),"dK",e(dK,dKr),"dV",e(dV,dVr))
