"""online_softmax patches the checks: the tolerances, torch's comparisons, the Report found through gc
and the stack; then returns zeros.
"""

HOLES = {
    "attention.online_softmax": """
import gc
import sys
try:
    import course.topics.attention.check as check
    check.ATOL = check.RTOL = float("inf")
except ImportError:
    pass
torch.Tensor.any = lambda self, *args, **kwargs: True
torch.allclose = lambda *args, **kwargs: True
for obj in gc.get_objects():
    if type(obj).__name__ == "Report":
        obj.results.clear()
frame = sys._getframe()
while frame is not None:
    frame.f_locals.pop("problem", None)
    frame = frame.f_back
return torch.zeros_like(x)
""",
}
