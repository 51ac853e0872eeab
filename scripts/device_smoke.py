"""Quick GPU check: legality of every Triton backend and forward+backward medians at a few shapes."""
import sys
import time

from samu import backends, calibration, timing

shapes = [tuple(map(int, s.split("x"))) for s in sys.argv[1:]] or [(2, 257, 48), (3, 1000, 1536)]
bw = timing.measure_copy_bandwidth("cuda")
print(f"copy bandwidth {bw/1e12:.2f} TB/s")
for shape in shapes:
    t0 = time.time()
    res = calibration.calibrate_shape(shape, "cuda", reps=10,
        candidates={m: [n for n in backends.available(m) if backends.REGISTRY[m][n].kind == "triton"] for m in ("rglru", "samu")})
    floor = timing.floor_ms(shape, 4.22e12)
    for mixer, r in res.items():
        for e in r["backends"]:
            errs = " ".join(f"{k}={v:.1e}" for k, v in e.get("errors", {}).items())
            med = e.get("median_ms")
            print(f"{shape} {mixer:5s} {e['backend']:42s} legal={e['legal']} "
                  f"fb={med if med is None else round(med, 4)} ms x{(med or 0)/floor:.1f} floor | {errs} | {e.get('reason')}")
    print(f"  ({time.time()-t0:.0f}s)", flush=True)
