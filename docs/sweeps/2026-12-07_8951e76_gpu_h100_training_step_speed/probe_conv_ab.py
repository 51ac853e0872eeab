import importlib.util, json, sys, runpy
import samu, samu.model
spec = importlib.util.spec_from_file_location("samu._model_before", ".devrun/model_before.py")
mod = importlib.util.module_from_spec(spec); mod.__package__ = "samu"; sys.modules[spec.name] = mod
spec.loader.exec_module(mod)
samu.model.causal_conv1d = mod.causal_conv1d  # the convolution as it was before 082e486
sys.argv = ["probe_scale_speed.py", sys.argv[1], "8192:8"]
runpy.run_path(".devrun/probe_scale_speed.py", run_name="__main__")
