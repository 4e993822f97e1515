"""The ctypes binding (python/gdn/capi.py) against the C header: every struct the
binding mirrors must have the same size and alignment, and every mirrored
field the same offset and size, as the C compiler sees them; every struct
and function of the header must be in the binding (the import resolves each
function in the library). Run by ctest where python3 is found:

    python3 tests/check_binding.py CC INCLUDE_DIR LIBGDN
"""
import ctypes
import importlib.util
import os
import re
import subprocess
import sys
import tempfile

cc, include, libpath = sys.argv[1], sys.argv[2], sys.argv[3]
os.environ["GDN_LIB"] = libpath
# capi.py alone (standard library only), not the package, which needs numpy
_spec = importlib.util.spec_from_file_location(
    "gdn_capi", os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "python", "gdn", "capi.py"))
gdn = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gdn)

lines_c = ['#include <stdio.h>', '#include <stddef.h>', '#include "gdn.h"', "int main(void) {"]
want = []
for cname, S in gdn.STRUCTS.items():
    lines_c.append(f'    printf("{cname} sizeof %zu align %zu\\n", sizeof(struct {cname}), _Alignof(struct {cname}));')
    want.append(f"{cname} sizeof {ctypes.sizeof(S)} align {ctypes.alignment(S)}")
    for f, t in S._fields_:
        lines_c.append(f'    printf("{cname}.{f} %zu %zu\\n", offsetof(struct {cname}, {f}), '
                       f'sizeof(((struct {cname} *)0)->{f}));')
        want.append(f"{cname}.{f} {getattr(S, f).offset} {ctypes.sizeof(t)}")
lines_c.append("    return 0;\n}")

with tempfile.TemporaryDirectory() as d:
    src, exe = os.path.join(d, "layout.c"), os.path.join(d, "layout")
    with open(src, "w") as fh:
        fh.write("\n".join(lines_c) + "\n")
    subprocess.run([cc, "-std=c11", "-I", include, src, "-o", exe], check=True)
    got = subprocess.run([exe], check=True, capture_output=True, text=True).stdout.splitlines()

bad = [f"C: {g!r}  ctypes: {w!r}" for g, w in zip(got, want) if g != w]
if len(got) != len(want):
    bad.append(f"{len(got)} lines from C, {len(want)} from ctypes")
header = open(os.path.join(include, "gdn.h")).read()
funcs = re.findall(r"^\s*(?:const\s+)?\w+\s*\*?\s*(gdn_\w+)\s*\(", header, re.M)
structs = re.findall(r"typedef struct (gdn_\w+) \{", header)
bad += [f"function {n}: in gdn.h, not in python/gdn.py" for n in funcs if n not in gdn._PROTOS]
bad += [f"struct {n}: in gdn.h, not in python/gdn.py" for n in structs if n not in gdn.STRUCTS]
for b in bad:
    print("MISMATCH", b)
print(f"binding: {len(gdn.STRUCTS)} structs, {len(want) - len(gdn.STRUCTS)} fields, {len(gdn._PROTOS)} functions: "
      f"{'ok' if not bad else f'{len(bad)} mismatches'}")
sys.exit(1 if bad else 0)
