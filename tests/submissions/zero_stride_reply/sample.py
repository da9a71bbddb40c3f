"""online_softmax writes its own reply onto the grader's channel: a tensor of 4 bytes with zero
strides and the shape of a terabyte, and the call's arguments; then it returns zeros."""

HOLES = {
    "attention.online_softmax": """
import json, os, struct
config = json.loads(open("/proc/self/cmdline", "rb").read().split(b"\\0")[-2])
huge = {"tensor": {"storage": 0, "dtype": "float32", "shape": [1 << 20, 1 << 18], "stride": [0, 0],
                   "offset": 0}}
after = {"list": [{"tensor": {"storage": 1, "dtype": "float32", "shape": list(x.shape),
                              "stride": list(x.stride()), "offset": 0}}]}
storages = [{"device": "cpu", "dtype": "float32", "start": 0, "count": 1},
            {"device": "cpu", "dtype": "float32", "start": 4, "count": x.numel()}]
blob = b"\\0" * (4 + 4 * x.numel())  # the grader refuses the result before it reads these
header = json.dumps({"op": "result", "result": huge, "after": after, "storages": storages}).encode()
os.write(config["replies"], b"GRD1" + struct.pack(">IQ", len(header), len(blob)) + header + blob)
return torch.zeros_like(x)
""",
}
