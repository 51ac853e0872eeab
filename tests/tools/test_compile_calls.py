"""tools/compile_calls.py: each single-pass backend's calls compiled for sm_90 without a GPU at
the shapes whose ints Triton specialises (one token, one chunk), plain and with state, packing
and resets; in a process of its own, since this one runs Triton's interpreter."""
import os
import subprocess
import sys

import pytest

from samu import backends, paths

TOOL = paths.REPO_ROOT / "tools" / "compile_calls.py"


def _env(tmp_path):
    """This environment without the interpreter, with a Triton cache of the test's own."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    return {**env, "TRITON_CACHE_DIR": str(tmp_path / "triton-cache")}


# One mixer a test, so that pytest-xdist compiles the mixers' kernels in parallel.
@pytest.mark.parametrize("mixer", list(backends.REGISTRY))
def test_single_pass_calls_compile_at_one_token_and_one_chunk(tmp_path, mixer):
    env = _env(tmp_path)
    done = subprocess.run([sys.executable, str(TOOL), mixer, "--backends=singlepass", "1x1x32",
                           "2x5x48"], capture_output=True, text=True, env=env, timeout=600,
                          cwd=paths.REPO_ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert done.stdout.startswith("Triton ") and "132 SMs" in done.stdout.splitlines()[0]
    lines = [line for line in done.stdout.splitlines() if ": compiled " in line]
    # each of the mixer's single-pass backends at 1x1x32 plain and stateful, at 2x5x48 plain
    names = [n for n in backends.available(mixer) if "singlepass" in n]
    assert all(line.startswith(f"{mixer} ") for line in lines)
    assert len(lines) == 3 * len(names) >= 3
    assert all(int(line.split(": compiled ")[1].split()[0]) >= 3 for line in lines)
    assert sum("with state, packing and resets" in line for line in lines) == len(names)


def test_the_interpreter_is_refused(capsys, monkeypatch):
    import importlib.util
    spec = importlib.util.spec_from_file_location("compile_calls", TOOL)
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # refused before any driver is replaced
    with pytest.raises(SystemExit):
        tool.main(["samu"])
    assert "TRITON_INTERPRET=1 compiles nothing" in capsys.readouterr().err


def test_a_filter_that_matches_nothing_is_refused(tmp_path):
    env = _env(tmp_path)
    done = subprocess.run([sys.executable, str(TOOL), "--backends=nosuchword"],
                          capture_output=True, text=True, env=env, timeout=300,
                          cwd=paths.REPO_ROOT)
    assert done.returncode == 2 and "no Triton backend matches ['nosuchword']" in done.stderr


def test_a_target_neither_mixer_nor_shape_is_refused(tmp_path):
    done = subprocess.run([sys.executable, str(TOOL), "mamba"], capture_output=True, text=True,
                          env=_env(tmp_path), timeout=300, cwd=paths.REPO_ROOT)
    assert done.returncode == 2 and "bad shape 'mamba'" in done.stderr
    assert "or name a mixer" in done.stderr
