"""The README's example is the quickstart script, and it learns."""

import pathlib
import re
import runpy

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_readme_example_is_the_quickstart_script():
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"<!-- quickstart:begin -->\n```python\n(.*?)```\n<!-- quickstart:end -->", readme, re.S)
    assert block, "README has no quickstart block"
    assert block.group(1) == (ROOT / "scripts" / "quickstart.py").read_text()


def test_quickstart_reward_rises():
    rewards = runpy.run_path(str(ROOT / "scripts" / "quickstart.py"))["rewards"]
    assert sum(rewards[:3]) / 3 < 0.3
    assert sum(rewards[-5:]) / 5 > 0.8
