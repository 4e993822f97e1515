"""Every python block of docs/python.md and of the README runs as it is."""
import os
import re

import pytest

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, os.pardir)
BLOCKS = [b for doc in ("docs/python.md", "README.md") if os.path.exists(os.path.join(ROOT, doc))
          for b in re.findall(r"```python\n(.*?)```", open(os.path.join(ROOT, doc)).read(), re.S)]


@pytest.mark.skipif(not BLOCKS, reason="the docs are not beside the tests")
@pytest.mark.parametrize("i", range(len(BLOCKS)))
def test_example_runs(i):
    exec(compile(BLOCKS[i], f"python block {i} of the docs", "exec"), {})
