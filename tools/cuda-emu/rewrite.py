#!/usr/bin/env python3
"""Rewrites src/cuda/*.cu and *.cuh into host C++ for the CUDA emulator (see README.md).

usage: rewrite.py SRC_CUDA_DIR OUT_CUDA_DIR
  foo.cu -> OUT/foo.cu.cpp, foo.cuh -> OUT/foo.cuh (same name, so "cuda/foo.cuh" includes
  resolve to the rewritten header when OUT's parent comes first on the include path).
Changes: kernel<<<grid, block, smem, stream>>>(args) -> ::emu::launch(kernel,
::emu::LaunchCfg(grid, block, smem, stream), args); `extern __shared__ T name[];` -> a
pointer to the launch's dynamic shared memory; `__shared__ T a, b[n];` -> function statics
registered with ::emu::shared_decl (poisoned per CTA); `#ifdef __CUDACC__` -> `#if 1`.
Files are written only when their text changes (keeps incremental builds incremental).
"""
import os
import re
import sys

SKIP = {'bandwidth.cu'}  # timing only (cudaEvent), not emulated

LAUNCH = re.compile(r'((?:\w+::)*[A-Za-z_]\w*(?:<[^<>;]*>)?)\s*<<<(.*?)>>>\s*\(', re.S)
EXTERN_SHARED = re.compile(
    r'extern\s+__shared__\s+(?:__align__\(\s*\d+\s*\)\s+)?([\w: ]+?)\s+(\w+)\s*\[\s*\]\s*;')
SHARED = re.compile(r'(?<![\w#])__shared__\s+(?:__align__\(\s*\d+\s*\)\s+)?([^;{}()]*?);')


def shared_decl(m):
    decl = m.group(1)
    # Declarators split at top-level commas; the first one carries the type.
    parts, depth, cur = [], 0, ''
    for ch in decl:
        depth += ch in '[<'
        depth -= ch in ']>'
        if ch == ',' and depth == 0:
            parts.append(cur)
            cur = ''
        else:
            cur += ch
    parts.append(cur)
    names = []
    for i, p in enumerate(parts):
        head = p.split('[')[0].strip()
        name = re.findall(r'[A-Za-z_]\w*', head)
        if not name or (i == 0 and len(name) < 2):
            sys.exit(f'rewrite.py: cannot parse __shared__ declaration: {m.group(0)!r}')
        names.append(name[-1])
    regs = ' '.join(f'::emu::shared_decl(&{n}, sizeof({n}));' for n in names)
    return f'static {decl}; {regs}'


def rewrite(text):
    text = LAUNCH.sub(
        lambda m: f'::emu::launch({m.group(1)}, ::emu::LaunchCfg({m.group(2)}), ', text)
    text = EXTERN_SHARED.sub(
        r'\1* \2 = reinterpret_cast<\1*>(::emu::dyn_smem());', text)
    text = SHARED.sub(shared_decl, text)
    return text.replace('#ifdef __CUDACC__', '#if 1')


def main():
    src, out = sys.argv[1], sys.argv[2]
    os.makedirs(out, exist_ok=True)
    for f in sorted(os.listdir(src)):
        if not f.endswith(('.cu', '.cuh')) or f in SKIP:
            continue
        path = os.path.join(src, f)
        with open(path) as fh:
            text = fh.read()
        body = '#include "emu.h"\n#line 1 "' + os.path.abspath(path) + '"\n' + rewrite(text)
        dst = os.path.join(out, f + ('.cpp' if f.endswith('.cu') else ''))
        old = None
        if os.path.exists(dst):
            with open(dst) as fh:
                old = fh.read()
        if old != body:
            with open(dst, 'w') as fh:
                fh.write(body)


if __name__ == '__main__':
    main()
