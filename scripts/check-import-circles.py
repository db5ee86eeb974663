#!/usr/bin/env python3
"""Import circles between the files of each crate of the workspace (scripts/test.sh runs it).

A file imports another when its code (not its comments) names a path into it (`crate::a::b`,
`super::x`, `self::y`, use trees included). A child using its ancestors' items is not a circle; two
siblings that import each other, directly or around a ring, are: one of them holds what belongs to
both, and should move it to a room of its own. Exits non-zero with every circle listed.

Usage: scripts/check-import-circles.py [SRC_DIR ...]   (default: src and crates/*/src)
"""
import os, re, sys
def modfiles(src):
    m = {}
    for dp, dn, fn in os.walk(src):
        for f in fn:
            if not f.endswith('.rs'): continue
            p = os.path.join(dp, f); rel = os.path.relpath(p, src)[:-3].split('/')
            if rel[-1] in ('mod', 'lib', 'main'): rel = rel[:-1]
            m[tuple(rel)] = p
    return m
def resolve(m, path):
    # longest prefix that is a module
    for k in range(len(path), -1, -1):
        if tuple(path[:k]) in m: return tuple(path[:k])
def paths_in(s):
    # expand use trees roughly: crate::a::{b, c::d} -> [a,b], [a,c,d]; super::x
    out = []
    for m in re.finditer(r'\b(crate|super|self)((?:::(?:[a-z_][a-z0-9_]*|super))*)(::\{)?', s):
        base = [m.group(1)] + [x for x in m.group(2).split('::') if x]
        if m.group(3):
            depth, i, start = 1, m.end(), m.end(); items = []; cur = ''
            while i < len(s) and depth:
                ch = s[i]
                if ch == '{': depth += 1
                elif ch == '}': depth -= 1
                if depth == 1 and ch == ',': items.append(cur); cur = ''
                elif depth >= 1: cur += ch
                i += 1
            items.append(cur)
            for it in items:
                first = re.match(r'\s*([a-z_][a-z0-9_]*)', it)
                if first: out.append(base + [first.group(1)])
        out.append(base)
    return out
def graph(src):
    m = modfiles(src); g = {k: set() for k in m}
    for mod, p in m.items():
        s = re.sub(r'//[^\n]*', '', open(p).read())
        for path in paths_in(s):
            if path[0] == 'crate': abs_ = path[1:]
            else:
                cur = list(mod) if (p.endswith('mod.rs') or p.endswith('lib.rs')) else list(mod)
                # `super` from a file module x/y.rs (mod (x,y)) means (x); `self` means (x,y)
                rest = path[:]
                if rest[0] == 'self': rest = rest[1:]
                while rest and rest[0] == 'super': cur = cur[:-1]; rest = rest[1:]
                abs_ = cur + rest
            t = resolve(m, abs_)
            if t is None or t == mod: continue
            if mod[:len(t)] == t: continue  # ancestor
            g[mod].add(t)
    return g
def sccs(g):
    idx, low, st, on, out, n = {}, {}, [], set(), [], [0]
    sys.setrecursionlimit(10000)
    def sc(v):
        idx[v] = low[v] = n[0]; n[0] += 1; st.append(v); on.add(v)
        for w in g[v]:
            if w not in idx: sc(w); low[v] = min(low[v], low[w])
            elif w in on: low[v] = min(low[v], idx[w])
        if low[v] == idx[v]:
            comp = []
            while True:
                w = st.pop(); on.discard(w); comp.append(w)
                if w == v: break
            if len(comp) > 1: out.append(comp)
    for v in g:
        if v not in idx: sc(v)
    return out
bad = 0
import glob
root = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..')
dirs = sys.argv[1:] or [os.path.join(root, 'src')] + sorted(glob.glob(os.path.join(root, 'crates/*/src')))
for src in dirs:
    for comp in sccs(graph(src)):
        bad += 1; print(src, 'circle:', sorted('/'.join(c) or 'lib' for c in comp))
print(f'import circles: {bad} in {len(dirs)} source trees')
sys.exit(1 if bad else 0)
