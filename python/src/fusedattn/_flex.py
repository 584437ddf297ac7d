"""Score modifiers (flex attention) for fusedattn.attention: expressions over the score and the
indices, written with Python operators, lowered through the binding to the library's graphs.

    from fusedattn import flex
    softcap = 30 * flex.tanh(flex.score / 30)                  # score_mod
    causal = flex.q_idx >= flex.kv_idx                          # mask_mod (True = visible)
    doc = flex.Tensor(doc_ids)                                  # int32 [batch, seqlen]
    same_doc = doc[flex.batch, flex.q_idx] == doc[flex.batch, flex.kv_idx]
    o = fusedattn.attention(q, k, v, score_mod=softcap, mask_mod=causal & same_doc)

An expression is data, not traced code: each operator makes a node, and a ScoreMod lowers the
nodes into a fusedattn_score_mod graph (the library hash-conses equal nodes, derives the
backward and keys its caches on the structure). include/fusedattn/fusedattn.h says what every
operation computes and where the modifier enters the attention.

Booleans combine with & | ~ (Python's and/or/not cannot be overloaded); where(c, a, b) selects.
"""

import numbers
import sys

from . import _C
from ._errors import InvalidArgumentError

_INPUTS = ("score", "batch", "head", "q_idx", "kv_idx", "seqlen_q", "seqlen_kv")
_AXES = ("batch", "head", "q_idx", "kv_idx")  # a tensor's axes, in this order
_AXIS_BITS = {"batch": 1, "head": 2, "q_idx": 4, "kv_idx": 8}


class Expr:
    """A node of a score-modifier expression: an input, a constant, a tensor read or an operation
    on other expressions. Immutable."""

    __slots__ = ("op", "args", "value", "_lowered")

    def __init__(self, op, args=(), value=None):
        self.op = op
        self.args = tuple(args)
        self.value = value
        self._lowered = None  # (other expression, role, ScoreMod) of as_score_mod's last call

    # Arithmetic
    def __add__(self, other): return _op("add", self, other)
    def __radd__(self, other): return _op("add", other, self)
    def __sub__(self, other): return _op("sub", self, other)
    def __rsub__(self, other): return _op("sub", other, self)
    def __mul__(self, other): return _op("mul", self, other)
    def __rmul__(self, other): return _op("mul", other, self)
    def __truediv__(self, other): return _op("div", self, other)
    def __rtruediv__(self, other): return _op("div", other, self)
    def __neg__(self): return _op("neg", self)
    def __pos__(self): return self
    def __abs__(self): return _op("abs", self)

    # Comparisons (return boolean expressions)
    def __lt__(self, other): return _op("lt", self, other)
    def __le__(self, other): return _op("le", self, other)
    def __gt__(self, other): return _op("gt", self, other)
    def __ge__(self, other): return _op("ge", self, other)
    def __eq__(self, other): return _op("eq", self, other)
    def __ne__(self, other): return _op("ne", self, other)

    # Logic on booleans
    def __and__(self, other): return _op("and", self, other)
    def __rand__(self, other): return _op("and", other, self)
    def __or__(self, other): return _op("or", self, other)
    def __ror__(self, other): return _op("or", other, self)
    def __invert__(self): return _op("not", self)

    __hash__ = object.__hash__  # identity: expressions are nodes, == builds one

    def __bool__(self):
        raise TypeError("a score_mod expression has no truth value: it is evaluated by the "
                        "library; combine conditions with & | ~ and choose with where()")

    def __repr__(self):
        if self.op == "input":
            return self.value
        if self.op == "const":
            return repr(self.value)
        if self.op == "tensor":
            tensor, axes = self.value
            return "%s[%s]" % (tensor.name, ", ".join(axes))
        return "%s(%s)" % (self.op, ", ".join(repr(a) for a in self.args))


def _as_expr(x):
    if isinstance(x, Expr):
        return x
    if isinstance(x, bool):
        raise TypeError("a Python bool (%r) is not a score_mod expression: compare expressions "
                        "to get a condition" % (x,))
    if isinstance(x, numbers.Real):
        return Expr("const", value=float(x))
    raise TypeError("expected a score_mod expression or a number, got %s" % type(x).__name__)


def _op(name, *operands):
    return Expr(name, [_as_expr(o) for o in operands])


# The inputs
score = Expr("input", value="score")          # s, the score after the built-in pipeline
batch = Expr("input", value="batch")          # b, the sequence
head = Expr("input", value="head")            # h, the query head
q_idx = Expr("input", value="q_idx")          # i, query position inside the sequence
kv_idx = Expr("input", value="kv_idx")        # j, key position inside the sequence
seqlen_q = Expr("input", value="seqlen_q")    # the sequence's query length
seqlen_kv = Expr("input", value="seqlen_kv")  # the sequence's key length
q_idx_br = q_idx + (seqlen_kv - seqlen_q)     # i aligned to the end of the keys (bottom-right)


def exp(x): return _op("exp", x)
def log(x): return _op("log", x)
def tanh(x): return _op("tanh", x)
def sigmoid(x): return _op("sigmoid", x)
def minimum(a, b): return _op("min", a, b)
def maximum(a, b): return _op("max", a, b)


def where(cond, a, b):
    """cond ? a : b (the gradient flows into the branch taken only)."""
    return _op("select", cond, a, b)


def constant(value):
    """A constant as an expression (numbers in expressions become constants by themselves)."""
    return _as_expr(value)


class Tensor:
    """An auxiliary tensor of a score modifier: a NumPy array read at the indices it is indexed
    with, e.g. bias[flex.head, flex.q_idx, flex.kv_idx] for an array [heads_q, seqlen_q,
    seqlen_kv]. The indices are a subset of (batch, head, q_idx, kv_idx) in that order, one
    dimension each, of the full size (batch, heads_q, seqlen_q, seqlen_kv); the tensor is
    broadcast over the others. tensor[()] reads a scalar (an array of shape [1]).

    dtype: float32, float16, bfloat16 or int32; a NumPy array, or a torch tensor on the device of
    the attention's tensors. requires_grad: attention_backward returns its gradient in
    Gradients.dscore_mod[name]; with torch tensors, autograd gives it to the tensor (whose own
    requires_grad then also says it is wanted)."""

    def __init__(self, array, name=None, requires_grad=False):
        self.array = array
        self.name = name  # None: "t<k>" for the k-th tensor a graph declares
        self.requires_grad = bool(requires_grad)

    def __getitem__(self, index):
        if not isinstance(index, tuple):
            index = (index,)
        axes = []
        for i in index:
            axis = i.value if isinstance(i, Expr) and i.op == "input" else None
            if axis not in _AXES:
                raise InvalidArgumentError(
                    "tensor %r is indexed by %r: index it by flex.batch, flex.head, flex.q_idx "
                    "and flex.kv_idx only" % (self.name, i))
            axes.append(axis)
        order = [_AXES.index(a) for a in axes]
        if order != sorted(set(order)):
            raise InvalidArgumentError(
                "tensor %r is indexed by [%s]: each of batch, head, q_idx, kv_idx at most once, "
                "in that order" % (self.name, ", ".join(axes)))
        return Expr("tensor", value=(self, tuple(axes)))

    def __repr__(self):
        return "Tensor(%s, shape=%s)" % (self.name, tuple(getattr(self.array, "shape", ())))


def _dtype_name(array):
    dtype = getattr(array, "dtype", None)
    name = getattr(dtype, "name", None)
    if name is None and type(dtype).__module__ == "torch":  # torch.bfloat16 -> "bfloat16"
        name = str(dtype)[len("torch."):]
    if name not in _DTYPE_CODES:
        raise InvalidArgumentError("score_mod tensors are float32, float16, bfloat16 or int32 "
                                   "arrays, got %s" % (name,))
    return name


# The library's codes (fusedattn.h), read once from the extension.
_DTYPE_CODES = {name: _C.Dtype.__members__[name].value
                for name in ("float32", "float16", "bfloat16", "int32")}
_INPUT_CODES = {name: i for i, name in enumerate(_INPUTS)}  # fusedattn_score_mod_variable order
_HEADER = "fusedattn_score_mod 1"


def _utf8_hex(text):
    """The UTF-8 bytes of text as hex digits, in integer arithmetic alone (torch.compile traces
    this; it does not trace bytes.hex)."""
    out = []
    for c in text:
        n = ord(c)
        if n < 0x80:
            units = (n,)
        elif n < 0x800:
            units = (0xC0 | n >> 6, 0x80 | n & 0x3F)
        elif n < 0x10000:
            units = (0xE0 | n >> 12, 0x80 | n >> 6 & 0x3F, 0x80 | n & 0x3F)
        else:
            units = (0xF0 | n >> 18, 0x80 | n >> 12 & 0x3F, 0x80 | n >> 6 & 0x3F, 0x80 | n & 0x3F)
        out.extend("%02x" % u for u in units)
    return "".join(out)


def _lower(score, mask, gradients):
    """(text, slots, names): the serialized graph (fusedattn_score_mod_serialize's format, see
    src/flex/serialize.h) of the outputs, the (Tensor, axes) read by each declared tensor and
    the tensors' names in the graph.

    Plain Python over the expression objects, with no call into the library, so that
    torch.compile traces it (the library checks the graph when it rebuilds it from the text)."""
    lines = [_HEADER]
    index = {}   # id(expression) -> node number; `keep` holds them, so no id is reused meanwhile
    keep = []
    slots = []   # (Tensor, axes) per declared tensor
    names = []   # and its name in the graph
    tensor_nodes = {}  # (id(Tensor), axes) -> (node number, tensor number)

    def node(expr):
        stack = [expr]
        while stack:
            e = stack[-1]
            if id(e) in index:
                stack.pop()
                continue
            pending = [a for a in e.args if id(a) not in index]
            if pending:
                stack.extend(reversed(pending))
                continue
            stack.pop()
            if e.op == "tensor":
                tensor, axes = e.value
                key = (id(tensor), axes)
                if key not in tensor_nodes:
                    name = tensor.name if tensor.name is not None else "t%d" % len(slots)
                    if any(t is tensor for t, _ in slots):
                        name = "%s[%s]" % (name, ",".join(axes))
                    bits = sum(_AXIS_BITS[a] for a in axes)
                    lines.append("tensor %d %d %d %s" % (
                        _DTYPE_CODES[_dtype_name(tensor.array)], bits,
                        1 if tensor.requires_grad else 0, _utf8_hex(name)))
                    tensor_nodes[key] = (len(lines) - 2, len(slots))
                    slots.append((tensor, axes))
                    names.append(name)
                index[id(e)] = tensor_nodes[key][0]
            else:
                if e.op == "input":
                    line = "input %d" % _INPUT_CODES[e.value]
                elif e.op == "const":
                    line = "const " + float(e.value).hex()
                else:
                    line = "op %s %s" % (e.op, " ".join(str(index[id(a)]) for a in e.args))
                lines.append(line)
                index[id(e)] = len(lines) - 2
            keep.append(e)
        return index[id(expr)]

    roots = []
    if score is not None:
        roots.append("score %d" % node(_as_expr(score)))
    if mask is not None:
        roots.append("mask %d" % node(_as_expr(mask)))
    for wrt, gradient in (gradients or {}).items():
        g = node(_as_expr(gradient))
        if isinstance(wrt, Expr) and wrt.op == "input" and wrt.value == "score":
            roots.append("grad_score %d" % g)
        elif isinstance(wrt, Expr) and wrt.op == "tensor":
            tensor, axes = wrt.value
            node(wrt)
            roots.append("grad_tensor %d %d" % (tensor_nodes[(id(tensor), axes)][1], g))
        else:
            raise InvalidArgumentError("gradients: %r is neither flex.score nor a tensor read; "
                                       "derivatives are taken with respect to those" % (wrt,))
    return ";".join(lines + roots) + ";", slots, names


def declared_requires_grad(text):
    """Per tensor a serialized graph declares, in order, whether it requires grad (the text's
    "tensor <dtype> <axes> <requires_grad> <name>" items; see src/flex/serialize.h)."""
    return [item.split(" ")[3] == "1" for item in text.split(";") if item.startswith("tensor ")]


def with_requires_grad(text, wanted):
    """The serialized graph with each declared tensor's requires_grad set to wanted[k], except
    that a tensor whose explicit gradient the graph gives keeps requires_grad (which that
    needs). A framework that decides per call which gradients it wants (JAX) uses this."""
    items = text.split(";")
    explicit = {int(item.split(" ")[1]) for item in items if item.startswith("grad_tensor ")}
    k = 0
    for n, item in enumerate(items):
        if item.startswith("tensor "):
            words = item.split(" ")
            words[3] = "1" if wanted[k] or (k in explicit and words[3] == "1") else "0"
            items[n] = " ".join(words)
            k += 1
    return ";".join(items)


def reads_input(text, name):
    """Whether a serialized graph reads the input `name` (one of score, batch, head, q_idx,
    kv_idx, seqlen_q, seqlen_kv) as a number."""
    return ("input %d" % _INPUT_CODES[name]) in text.split(";")


def _compiling():
    """Whether torch.compile is tracing this call (then nothing may call into the library)."""
    torch = sys.modules.get("torch")
    return torch is not None and torch.compiler.is_compiling()


class ScoreMod:
    """A score modifier: a score expression (a number; None leaves the score as is), a mask
    expression (a boolean, True = visible; None hides nothing more), and optionally hand-written
    derivatives {flex.score or a tensor read: expression} that the backward then uses instead of
    the derived ones.

    `text` is its serialized graph, the form the library and the torch ops take; the library
    checks it here (outside torch.compile) and raises InvalidArgumentError naming what is wrong.
    Equal ScoreMods (built from the same expressions) compare equal and hash equal; the
    library's caches treat them as one."""

    def __init__(self, score=None, mask=None, gradients=None):
        if score is None and mask is None:
            raise InvalidArgumentError("a ScoreMod needs a score or a mask expression")
        self.text, self.slots, self.names = _lower(score, mask, gradients)
        self._graph = None
        if not _compiling():
            self._graph = _C.ScoreModGraph.deserialize(self.text)

    @property
    def graph(self):
        """The library's finalized graph (fusedattn._C.ScoreModGraph), rebuilt from the text."""
        if self._graph is None:
            self._graph = _C.ScoreModGraph.deserialize(self.text)
        return self._graph

    def tensors(self):
        """The arrays of the call, in declaration order."""
        return [t.array for t, _ in self.slots]

    def describe(self):
        """The outputs and the derivatives the backward uses, as text."""
        return self.graph.describe()

    def __eq__(self, other):
        return isinstance(other, ScoreMod) and self.graph.equal(other.graph)

    def __hash__(self):
        return hash(self.graph.hash())

    def __repr__(self):
        return "ScoreMod(%s)" % self.describe().replace("\n", "; ")


def as_score_mod(score_mod=None, mask_mod=None):
    """A ScoreMod from attention()'s score_mod / mask_mod arguments (expressions, or a ScoreMod
    as score_mod), or None when both are None. The ScoreMod of a pair of expressions is kept on
    the first expression (expressions are immutable), so a call repeated with the same ones
    lowers them once."""
    if isinstance(score_mod, ScoreMod):
        if mask_mod is not None:
            raise InvalidArgumentError("score_mod is a ScoreMod (which carries its own mask): "
                                       "pass mask_mod inside it, ScoreMod(score=..., mask=...)")
        return score_mod
    if score_mod is None and mask_mod is None:
        return None
    for name, value in (("score_mod", score_mod), ("mask_mod", mask_mod)):
        if value is not None and not isinstance(value, Expr):
            raise InvalidArgumentError(
                "%s must be a fusedattn.flex expression (built from flex.score, flex.q_idx, ... "
                "with operators), got %s; Python functions are not traced" %
                (name, type(value).__name__))
    if _compiling():
        return ScoreMod(score=score_mod, mask=mask_mod)
    owner, other = (score_mod, mask_mod) if score_mod is not None else (mask_mod, None)
    cached = owner._lowered
    if cached is not None and cached[0] is other and cached[1] is (score_mod is None):
        return cached[2]
    mod = ScoreMod(score=score_mod, mask=mask_mod)
    # The cache holds `other`, so the identity test above never meets a reused address.
    owner._lowered = (other, score_mod is None, mod)
    return mod
