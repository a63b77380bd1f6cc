"""The ctypes structures mirror pagedattn.h: every field's offset and every struct's size, as
the C compiler lays them out (skipped when no compiler or header is at hand)."""

import ctypes
import os
import shutil
import subprocess

import pytest

from pagedattn import _lib as L

HEADER_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "include")
STRUCTS = [L.pa_blocksparse, L.pa_layer_config, L.pa_cache, L.pa_seq, L.pa_batch_config,
           L.pa_batch_metadata, L.pa_context_options, L.pa_forward_args, L.pa_merge_args]


def test_struct_layout_matches_header(tmp_path):
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if not cc or not os.path.exists(os.path.join(HEADER_DIR, "pagedattn.h")):
        pytest.skip("needs a C compiler and include/pagedattn.h")
    lines = ["#include <stdio.h>", "#include <stddef.h>", '#include "pagedattn.h"',
             "int main(void) {"]
    want = []
    for st in STRUCTS:
        n = st.__name__
        lines.append('printf("%s %%zu\\n", sizeof(%s));' % (n, n))
        want.append("%s %d" % (n, ctypes.sizeof(st)))
        for f in st._fields_:
            lines.append('printf("%s.%s %%zu\\n", offsetof(%s, %s));' % (n, f[0], n, f[0]))
            want.append("%s.%s %d" % (n, f[0], getattr(st, f[0]).offset))
    lines.append("return 0; }")
    src = tmp_path / "layout.c"
    src.write_text("\n".join(lines))
    exe = tmp_path / "layout"
    subprocess.check_call([cc, "-std=c11", "-I", HEADER_DIR, str(src), "-o", str(exe)])
    got = subprocess.check_output([str(exe)]).decode().split("\n")[:-1]
    assert got == want


def test_enum_values_match_header(tmp_path):
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if not cc or not os.path.exists(os.path.join(HEADER_DIR, "pagedattn.h")):
        pytest.skip("needs a C compiler and include/pagedattn.h")
    names = {"PA_DTYPE_F32": L.PA_DTYPE_F32, "PA_DTYPE_F16": L.PA_DTYPE_F16,
             "PA_DTYPE_BF16": L.PA_DTYPE_BF16, "PA_DTYPE_FP8_E4M3": L.PA_DTYPE_FP8_E4M3,
             "PA_DTYPE_FP8_E5M2": L.PA_DTYPE_FP8_E5M2, "PA_ATTN_DECODER": L.PA_ATTN_DECODER,
             "PA_ATTN_ENCODER": L.PA_ATTN_ENCODER, "PA_ATTN_ENCODER_ONLY": L.PA_ATTN_ENCODER_ONLY,
             "PA_ATTN_ENCODER_DECODER": L.PA_ATTN_ENCODER_DECODER,
             "PA_MEMORY_HOST": L.PA_MEMORY_HOST, "PA_LAYOUT_NHD": L.PA_LAYOUT_NHD,
             "PA_LAYOUT_HND": L.PA_LAYOUT_HND}
    for code, name in L.STATUS_NAMES.items():
        names["PA_STATUS_" + name] = code
    src = tmp_path / "enums.c"
    src.write_text('#include <stdio.h>\n#include "pagedattn.h"\nint main(void) {\n' +
                   "".join('printf("%%d\\n", (int)%s);\n' % n for n in names) + "return 0; }\n")
    exe = tmp_path / "enums"
    subprocess.check_call([cc, "-std=c11", "-I", HEADER_DIR, str(src), "-o", str(exe)])
    got = [int(x) for x in subprocess.check_output([str(exe)]).split()]
    assert got == list(names.values())
