"""The experiment around the library: legality against the float64 oracle, calibration, the
timing protocol, the result schema, the report and the papermill pipeline (``make reproduce``).

It needs the ``experiment`` extra (jsonschema, pandas, seaborn, papermill); ``import samu`` does
not import it."""
