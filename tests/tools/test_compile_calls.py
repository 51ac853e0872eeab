"""tools/compile_calls.py: each single-pass backend's calls compiled for sm_90 without a GPU at
the shapes whose ints Triton specialises (one token, one chunk), plain and with state, packing
and resets; in a process of its own, since this one runs Triton's interpreter."""
import os
import subprocess
import sys

import pytest

from samu import paths

TOOL = paths.REPO_ROOT / "tools" / "compile_calls.py"


def test_single_pass_calls_compile_at_one_token_and_one_chunk():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, str(TOOL), "--backends=singlepass", "1x1x32",
                           "2x5x48"], capture_output=True, text=True, env=env, timeout=600,
                          cwd=paths.REPO_ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    lines = [line for line in done.stdout.splitlines() if ": compiled " in line]
    # each single-pass backend at 1x1x32 plain and stateful, at 2x5x48 plain
    from samu import backends
    names = [n for m in backends.REGISTRY for n in backends.available(m) if "singlepass" in n]
    assert len(lines) == 3 * len(names) >= 3
    assert all(int(line.split(": compiled ")[1].split()[0]) >= 3 for line in lines)
    assert sum("with state, packing and resets" in line for line in lines) == len(names)


def test_the_interpreter_is_refused(capsys):
    import importlib.util
    spec = importlib.util.spec_from_file_location("compile_calls", TOOL)
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    assert os.environ.get("TRITON_INTERPRET") == "1"  # conftest sets it for the suite
    with pytest.raises(SystemExit):
        tool.main(["samu"])
    assert "TRITON_INTERPRET=1 compiles nothing" in capsys.readouterr().err


def test_a_filter_that_matches_nothing_is_refused():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, str(TOOL), "--backends=nosuchword"],
                          capture_output=True, text=True, env=env, timeout=300,
                          cwd=paths.REPO_ROOT)
    assert done.returncode == 2 and "no Triton backend matches ['nosuchword']" in done.stderr
