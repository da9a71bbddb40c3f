"""The course's executable specification of tree attention for speculative decoding.

Everything here is pure standard-library Python, slow and obviously correct,
written the way the papers' equations read: token trees, their masks and
FlashSpecInfer's DFS-interval encoding (`pyspec_ref.trees`), softmax,
attention, FlashAttention-2 tiling and the Flash-Decoding / DeFT merge
(`pyspec_ref.attention`), and DeFT's tree-structured KV cache: its flattened
layout, KV-guided grouping, flattened blocks with bitmasks, the global
reduction and the IO model (`pyspec_ref.deft`), and KV-cache bookkeeping after
verification: EMS-SD's unpadded batches and SwiftSpec's tree-aware cache
(`pyspec_ref.kvcache`), and SwiftSpec's parallel tree generation: the protocol
between a draft and a target worker, simulated with its invariants
(`pyspec_ref.parallel_tree`), and the best tree shape for a budget, Sequoia's
dynamic program (`pyspec_ref.tree_shape`). The GPU kernels of the course
are checked against these functions, never the other way round. Every function
validates its arguments and names the bad one in its error.

Note: ``pyspec_ref.attention`` is the re-exported *function*; it shadows the
submodule of the same name on the package. Import the module's names directly
(``from pyspec_ref.attention import flash_attention``) or get the module with
``importlib.import_module("pyspec_ref.attention")``.
"""

from . import attention as _attention_module
from . import deft as _deft_module
from . import kvcache as _kvcache_module
from . import parallel_tree as _parallel_tree_module
from . import sampling as _sampling_module
from . import tree_shape as _tree_shape_module
from . import trees as _trees_module
from .attention import *  # noqa: F403  (each module's __all__ is its public API)
from .deft import *  # noqa: F403
from .kvcache import *  # noqa: F403
from .parallel_tree import *  # noqa: F403
from .sampling import *  # noqa: F403
from .tree_shape import *  # noqa: F403
from .trees import *  # noqa: F403

__all__ = [*_trees_module.__all__, *_attention_module.__all__, *_deft_module.__all__,
           *_sampling_module.__all__, *_kvcache_module.__all__, *_parallel_tree_module.__all__,
           *_tree_shape_module.__all__]
