"""Record, on a machine with torch and transformers, the parameters transformers
builds for a model from its published config.json, on the meta device (no
weights are made): name, element type and shape of each, in the model's order,
and the state-dict names tied to another parameter.  The records are the
independent expectations of tests/test_weights_hf.py (tests/data/hf_params/NAME.json.gz).

    python tools/record_hf_params.py OUT_DIR tests/data/hf/llama-3.1-8b.json ...

A config's ``quantization_config`` is left out (the record is of the model's
unquantized parameters; a quantized checkpoint's own tensors are read from its
files), and each model is built in the config's ``torch_dtype``.
"""

import gzip
import json
import os
import sys


def record(path):
    import torch
    import transformers

    with open(path) as f:
        raw = json.load(f)
    raw.pop("quantization_config", None)
    arch = raw["architectures"][0]
    cfg = transformers.AutoConfig.for_model(raw["model_type"], **{
        k: v for k, v in raw.items() if k not in ("model_type", "architectures")})
    dtype = getattr(torch, raw.get("torch_dtype") or raw.get("dtype") or "float32")
    cls = getattr(transformers, arch)
    with torch.device("meta"):
        try:
            model = cls._from_config(cfg, dtype=dtype)
        except TypeError:
            model = cls._from_config(cfg, torch_dtype=dtype)
    params = [[n, str(p.dtype).removeprefix("torch."), list(p.shape)]
              for n, p in model.named_parameters()]
    named = {n for n, _d, _s in params}
    tied = [n for n in model.state_dict() if n not in named and
            n in dict(model.named_parameters(remove_duplicate=False))]
    return {"config": os.path.basename(path), "class": arch,
            "transformers": transformers.__version__, "torch": torch.__version__,
            "params": params, "tied": tied}


def main(argv):
    out = argv[0]
    os.makedirs(out, exist_ok=True)
    for path in argv[1:]:
        rec = record(path)
        name = os.path.basename(path) + ".gz"      # DeepSeek-V3: 47,000 parameters
        with gzip.open(os.path.join(out, name), "wt") as f:
            json.dump(rec, f, separators=(",", ":"))
        print(f"{name}: {rec['class']}, {len(rec['params'])} parameters, "
              f"{len(rec['tied'])} tied", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
