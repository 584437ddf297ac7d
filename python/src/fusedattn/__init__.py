"""fusedattn: fused scaled-dot-product attention (forward and backward) with automatic backend
selection, for PyTorch (autograd, torch.compile, CUDA graphs), NumPy and any DLPack framework.

    import fusedattn
    o = fusedattn.attention(q, k, v, layout="bshd", mask="causal")  # q: [batch, seq, heads, dim]
    print(fusedattn.explain(q, k, v, mask="causal"))        # which backend, and why
    fusedattn.backends()                                    # {name: "available" or why not}

The C API (include/fusedattn/fusedattn.h) specifies what is computed; fusedattn.forward and
fusedattn.backward expose it on preallocated tensors with a full config (make_config).
Drop-in entry points for model code (torch tensors): fusedattn.scaled_dot_product_attention
(torch.nn.functional's), fusedattn.flash_attn (flash_attn's functions), and
fusedattn.integrations.transformers (attn_implementation="fusedattn" in transformers).
Score modifiers (flex attention) are expressions of fusedattn.flex:
    o = fusedattn.attention(q, k, v, layout="bshd", score_mod=30 * flex.tanh(flex.score / 30),
                            mask_mod=flex.q_idx >= flex.kv_idx)
"""

import sys as _sys

from ._errors import Error, InvalidArgumentError, NotSupportedError, OutOfMemoryError
from . import _C
from . import _flex as flex
from ._api import (attention, attention_backward, backends, backward, cudnn_version, explain,
                   forward, version, workspace_size)
from ._problem import DropoutPositions, config_dict, make_config
from ._run import Gradients
from ._sdpa import scaled_dot_product_attention
from .flash_attn import flash_attn_func, flash_attn_varlen_func, flash_attn_with_kvcache

__version__ = _C.version()

__all__ = ["attention", "attention_backward", "explain", "backends", "version", "cudnn_version",
           "flex", "scaled_dot_product_attention", "flash_attn_func", "flash_attn_varlen_func",
           "flash_attn_with_kvcache",
           "forward", "backward", "make_config", "config_dict", "workspace_size", "Gradients",
           "DropoutPositions",
           "Error",
           "InvalidArgumentError", "NotSupportedError", "OutOfMemoryError"]

# With torch already loaded, register the torch ops now (torch.compile then finds them);
# otherwise the first torch tensor passed in loads them.
if "torch" in _sys.modules:
    from . import _torch  # noqa: F401
