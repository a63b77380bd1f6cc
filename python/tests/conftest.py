import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import pagedattn  # noqa: E402

# The backends this suite drives: those that read host memory (the package passes numpy
# arrays and CPU tensors; a device backend such as cuda refuses them, checked in test_errors).
BACKENDS = [b for b in pagedattn.available_backends()
            if pagedattn._lib.backend_memory(b) == pagedattn._lib.PA_MEMORY_HOST]


def pytest_report_header(config):
    return "pagedattn %s from %s; backends here: %s" % (
        pagedattn.version(), pagedattn.LIBRARY_PATH, ", ".join(BACKENDS))


@pytest.fixture(params=BACKENDS)
def backend(request):
    return request.param


@pytest.fixture
def rng(request):
    # a per-test seed, stable across runs
    seed = abs(hash(request.node.nodeid)) % (2 ** 32)
    import zlib
    seed = zlib.crc32(request.node.nodeid.encode())
    return np.random.default_rng(seed)
