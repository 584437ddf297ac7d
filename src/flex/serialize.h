// A self-contained text form of a score-modifier graph, so that a graph can cross boundaries
// where only strings travel: a torch op's schema (the graph is a `str` argument, a constant of a
// compiled FX graph), an XLA FFI attribute, a file.
//
// The text is the builder's log: the tensor declarations, then every node of the user's graph in
// creation order (operands before users) and the outputs. Replaying it through the Builder gives
// a graph equal to the original (same canonical form, same hash). Constants are hexadecimal
// floats (C's %a; Python's float.hex writes the same), exact; a NaN other than the canonical
// quiet one keeps its bits ("nan:<hex>").
//
// The format: items ended by ';' (one line: a compiler that prints a torch op's string argument
// into generated code or a comment cannot be thrown off by a newline), the header
// "fusedattn_score_mod 1" first; node items are numbered from 0 in order, and operands name
// earlier node items:
//   input <fusedattn_score_mod_variable>      const <number>
//   tensor <dtype> <axes> <requires_grad> <name as hex bytes>   (declares the next tensor)
//   op <name> <operand>...                    (names as in describe(): add, mul, select, ...)
//   score <node>   mask <node>   grad_score <node>   grad_tensor <tensor> <node>
// The Python package writes this text itself (fusedattn/_flex.py), so that lowering an
// expression needs no call into the library and torch.compile can trace it.
#pragma once

#include <string>

#include "common/status.h"
#include "flex/score_mod.h"

namespace fusedattn::flex {

// The text of a builder's graph (finalized or not).
std::string Serialize(const Builder& builder);

// Rebuilds a graph from Serialize's text into an empty builder; a malformed text is an
// InvalidArgument naming the item.
Status Deserialize(const std::string& text, Builder* builder);

}  // namespace fusedattn::flex
