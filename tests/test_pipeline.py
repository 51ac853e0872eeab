import pytest

from samu import pipeline


def test_parse_shape():
    assert pipeline.parse_shape("4x2048x2048") == (4, 2048, 2048)
    for bad in ("4x2048", "ax1x2", "0x4x16"):
        with pytest.raises(SystemExit, match="bad shape"):
            pipeline.parse_shape(bad)
