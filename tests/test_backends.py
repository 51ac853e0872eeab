import pytest
import torch

from samu import backends


def test_every_backend_is_explained():
    described = backends.describe()
    for mixer in ("rglru", "samu"):
        names = backends.available(mixer)
        assert {"reference_sequential", "reference_chunked"} <= set(names)
        assert sum(backends.REGISTRY[mixer][n].kind == "triton" for n in names) >= 2
        for name in names:
            assert len(described[mixer][name].split(" | ")) == len(name.split("_"))


def test_unknown_word_is_refused():
    with pytest.raises(ValueError, match="unknown word 'warp'"):
        backends.explain("fused_warp_chunk16")


def test_auto_without_cuda(monkeypatch):
    x = torch.randn(1, 4, 16)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert backends.resolve("samu", x).name == "reference_chunked"
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert backends.resolve("samu", x).name == backends.DEFAULTS["samu"]
    assert backends.resolve("rglru", x.double()).name == "reference_chunked"


def test_triton_backend_refuses_what_it_cannot_run(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(RuntimeError, match="needs a CUDA tensor"):
        backends.resolve("samu", torch.randn(1, 4, 16), backends.DEFAULTS["samu"])
    with pytest.raises(TypeError, match="not float64"):
        backends.resolve("samu", torch.randn(1, 4, 16).double(), backends.DEFAULTS["samu"])


def test_calibrated_choice_is_read(tmp_path, monkeypatch):
    from samu import paths, schema
    monkeypatch.setattr(paths, "DATA", tmp_path)
    doc = {"gpu": "Test GPU", "environment": {}, "shapes": {"1x8x16": {"samu": {
        "ranking": ["fused_controller_hierarchical_chunk32"],
        "chosen": "fused_controller_hierarchical_chunk32", "backends": []}}}}
    schema.write_json_atomic(paths.calibration_file("test-gpu"), doc, kind="calibration")
    assert backends.calibrated_choice("samu", (1, 8, 16), "test-gpu") == \
        "fused_controller_hierarchical_chunk32"
    assert backends.calibrated_choice("samu", (1, 9, 16), "test-gpu") is None
    assert backends.calibrated_choice("rglru", (1, 8, 16), "test-gpu") is None
    # A rewritten file is picked up once its writer calls forget_calibration (merge_calibration
    # does) or once RECHECK_SECONDS passed.
    doc["shapes"]["1x8x16"]["samu"]["chosen"] = "fused_controller_hierarchical_chunk8"
    schema.write_json_atomic(paths.calibration_file("test-gpu"), doc, kind="calibration")
    monkeypatch.setattr(backends, "RECHECK_SECONDS", 0.0)
    assert backends.calibrated_choice("samu", (1, 8, 16), "test-gpu") == \
        "fused_controller_hierarchical_chunk8"


def test_gpu_slug():
    assert backends.gpu_slug("NVIDIA H200") == "nvidia-h200"
    assert backends.gpu_slug("NVIDIA H800 PCIe") == "nvidia-h800-pcie"
