"""README's commands are the ones that work: CI runs the README's test line verbatim."""
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text().splitlines()
    commands = [line for line in readme if line.startswith("python3 -m venv .venv && ")]
    assert len(commands) == 2, commands
    demo, test = commands  # the main job (training), then the tests
    assert demo.endswith("python -m ge2 train") and test.endswith("python -m pytest -q -n 2")  # pytest-xdist: one worker per CI core
    assert demo.rsplit("&&", 1)[0] == test.rsplit("&&", 1)[0]  # same set-up for both
    assert "grep -m1 -E '^python3 -m venv .* -m pytest' README.md" in (ROOT / ".ci/run").read_text()


def test_readme_example_runs():
    src = (ROOT / "README.md").read_text()
    block = src.split("```python\n")[1].split("```")[0]
    namespace: dict = {}
    exec(compile(block, "README.md", "exec"), namespace)
    assert namespace["w"].grad is not None and namespace["ref"].shape == ()
