#!/usr/bin/env python3
"""Rewrite a CUDA source file (.cu) into C++ the CPU emulator compiles (see run.sh).

    python3 rewrite_cu.py IN.cu OUT.cpp

kernel<<<cfg>>>(args)              -> emu_launch(emu_cfg(cfg), kernel, args)
extern __shared__ T x[];           -> T *x = (T *)emu_dyn_smem();
Fails (exit 1, with a message) when the input cannot be read or has no code."""
import re
import sys


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: rewrite_cu.py IN.cu OUT.cpp")
    src = open(sys.argv[1]).read()
    if not src.strip():
        sys.exit("rewrite_cu.py: %s is empty" % sys.argv[1])
    src = re.sub(r'extern\s+__shared__\s+(?:__align__\(\d+\)\s+)?(\w+)\s+(\w+)\s*\[\]\s*;',
                 r'\1 *\2 = (\1 *)emu_dyn_smem();', src)
    launch = re.compile(r'([A-Za-z_]\w*(?:<[^<>;()]*>)?)\s*<<<(.*?)>>>\s*\(', re.S)
    src, n = launch.subn(lambda m: 'emu_launch(emu_cfg(%s), %s, ' % (m.group(2), m.group(1)), src)
    with open(sys.argv[2], 'w') as f:
        f.write('#include "emu_device.hpp"\n#line 1 "%s"\n' % sys.argv[1] + src)


if __name__ == '__main__':
    main()
