"""Every python block of docs/python.md runs as it is."""
import os
import re

import pytest

DOC = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, os.pardir, "docs", "python.md")
BLOCKS = re.findall(r"```python\n(.*?)```", open(DOC).read(), re.S) if os.path.exists(DOC) else []


@pytest.mark.skipif(not BLOCKS, reason="docs/python.md is not beside the tests")
@pytest.mark.parametrize("i", range(len(BLOCKS)))
def test_example_runs(i):
    exec(compile(BLOCKS[i], f"docs/python.md block {i}", "exec"), {})
