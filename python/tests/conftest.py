"""Shared pieces of the Python tests: the random seed (printed, and repeated
with GDN_TEST_SEED=<n>), the devices to run on, and the error measures of
DESIGN.md §5."""
import os
import random
import sys
import zlib

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))   # reference.py

torch = pytest.importorskip("torch")

SEED = int(os.environ.get("GDN_TEST_SEED") or random.SystemRandom().randrange(1, 2 ** 62))


def pytest_report_header(config):
    import gdn
    return f"gdn python tests: GDN_TEST_SEED={SEED}; gdn from {gdn.__file__}, libgdn {gdn.capi.lib._name}"


@pytest.fixture
def gen(request):
    """A torch generator seeded from the run's seed and the test's name."""
    return torch.Generator().manual_seed((SEED + zlib.crc32(request.node.name.encode())) % (2 ** 62))


DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def rel_err(out, ref):
    """||out - ref|| / ||ref|| in float64 (ref 0: the absolute error)."""
    out, ref = out.detach().double().cpu(), ref.detach().double().cpu()
    if not torch.isfinite(out).all():
        return float("inf")
    den = ref.norm().item()
    num = (out - ref).norm().item()
    return num / den if den > 0 else num


def terms_err(out, ref, terms2):
    """The error of a sum that can cancel, against the larger of ref and its terms (DESIGN.md §5)."""
    out, ref, terms2 = (x.detach().double().cpu() for x in (out, ref, terms2))
    if not torch.isfinite(out).all():
        return float("inf")
    den = torch.maximum(ref * ref, terms2).sum().sqrt().item()
    num = (out - ref).norm().item()
    return num / den if den > 0 else num


def close(what, out, ref, bound):
    e = rel_err(out, ref)
    assert e <= bound, f"{what}: relative error {e:.3e} over {bound:.0e} (GDN_TEST_SEED={SEED})"
