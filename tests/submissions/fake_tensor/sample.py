"""online_softmax returns zeros dressed as a tensor whose comparisons always succeed."""

HOLES = {
    "attention.online_softmax": """
class Liar(torch.Tensor):
    def __eq__(self, other):
        return torch.ones(self.shape, dtype=torch.bool)

    def allclose(self, *args, **kwargs):
        return True

return torch.zeros_like(x).as_subclass(Liar)
""",
}
