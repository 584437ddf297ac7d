#include "flex/serialize.h"

#include <cctype>
#include <cmath>
#include <cstdlib>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <sstream>
#include <vector>

namespace fusedattn::flex {

namespace {

constexpr const char* kHeader = "fusedattn_score_mod 1";

// Names may hold any byte; hex keeps each item a list of plain words.
std::string Hex(const std::string& bytes) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) {
    out += digits[c >> 4];
    out += digits[c & 15];
  }
  return out;
}

bool Unhex(const std::string& hex, std::string* out) {
  if (hex.size() % 2 != 0) return false;
  out->clear();
  for (size_t i = 0; i < hex.size(); i += 2) {
    unsigned value = 0;
    if (std::sscanf(hex.c_str() + i, "%2x", &value) != 1) return false;
    if (!std::isxdigit(static_cast<unsigned char>(hex[i])) ||
        !std::isxdigit(static_cast<unsigned char>(hex[i + 1])))
      return false;
    out->push_back(static_cast<char>(value));
  }
  return true;
}

constexpr uint64_t kCanonicalNan = 0x7FF8000000000000ull;

// A constant as Serialize writes it (C's %a, which Python's float.hex also writes), or "nan",
// or "nan:<bits>" for a NaN with another payload.
bool ParseConstant(const std::string& word, double* out) {
  uint64_t bits = 0;
  if (word == "nan") {
    bits = kCanonicalNan;
  } else if (word.rfind("nan:", 0) == 0) {
    std::string hex = word.substr(4);
    if (hex.size() != 16) return false;
    for (char c : hex)
      if (!std::isxdigit(static_cast<unsigned char>(c))) return false;
    bits = std::strtoull(hex.c_str(), nullptr, 16);
    std::memcpy(out, &bits, sizeof *out);
    return std::isnan(*out);
  } else {
    char* end = nullptr;
    *out = std::strtod(word.c_str(), &end);
    return !word.empty() && end == word.c_str() + word.size() && !std::isnan(*out);
  }
  std::memcpy(out, &bits, sizeof *out);
  return true;
}

bool OpByName(const std::string& name, Op* out) {
  for (int api = FUSEDATTN_SCORE_MOD_NEG; api <= FUSEDATTN_SCORE_MOD_SELECT; ++api) {
    Op op;
    if (OpFromApi(api, &op) && name == OpName(op)) {
      *out = op;
      return true;
    }
  }
  return false;
}

int ApiOpcode(Op op) {
  for (int api = FUSEDATTN_SCORE_MOD_NEG; api <= FUSEDATTN_SCORE_MOD_SELECT; ++api) {
    Op candidate;
    if (OpFromApi(api, &candidate) && candidate == op) return api;
  }
  return -1;
}

}  // namespace

std::string Serialize(const Builder& builder) {
  std::ostringstream out;
  out << kHeader << ";";
  const std::vector<Node>& nodes = builder.graph().nodes();
  for (const Node& n : nodes) {
    switch (n.op) {
      case Op::kInput: out << "input " << n.slot << ";"; break;
      case Op::kConstant: {
        char value[64];
        if (!std::isnan(n.value)) {
          std::snprintf(value, sizeof value, "%a", n.value);  // exact: hexadecimal digits
        } else if (DoubleBits(n.value) == kCanonicalNan) {
          std::snprintf(value, sizeof value, "nan");
        } else {
          std::snprintf(value, sizeof value, "nan:%016" PRIx64, DoubleBits(n.value));
        }
        out << "const " << value << ";";
        break;
      }
      case Op::kTensor: {
        const TensorDecl& t = builder.tensors()[static_cast<size_t>(n.slot)];
        out << "tensor " << static_cast<int>(t.dtype) << " " << t.axes << " "
            << (t.requires_grad ? 1 : 0) << " " << Hex(t.name) << ";";
        break;
      }
      default:
        out << "op " << OpName(n.op);
        for (int a = 0; a < Arity(n.op); ++a) out << " " << n.args[static_cast<size_t>(a)];
        out << ";";
    }
  }
  const Roots& roots = builder.roots();
  if (roots.score >= 0) out << "score " << roots.score << ";";
  if (roots.mask >= 0) out << "mask " << roots.mask << ";";
  if (roots.grad_score >= 0) out << "grad_score " << roots.grad_score << ";";
  for (size_t k = 0; k < roots.grad_tensor.size(); ++k)
    if (roots.grad_tensor[k] >= 0) out << "grad_tensor " << k << " " << roots.grad_tensor[k] << ";";
  return out.str();
}

Status Deserialize(const std::string& text, Builder* builder) {
  // Items end with ';' (newlines are accepted too, for texts written by hand).
  std::string items = text;
  for (char& c : items)
    if (c == '\n') c = ';';
  std::istringstream in(items);
  std::string item;
  int item_number = 0;
  auto bad = [&](const char* why) {
    return InvalidArgument("score_mod text, item %d ('%s'): %s", item_number, item.c_str(), why);
  };
  if (!std::getline(in, item, ';') || item != kHeader) {
    item_number = 1;
    return bad("expected the header 'fusedattn_score_mod 1' (not a serialized score_mod)");
  }
  item_number = 1;
  std::vector<int32_t> ids;  // text node -> builder node (equal when replayed in order)
  std::vector<int32_t> tensor_nodes;
  auto node_of = [&](int64_t text_id, int32_t* out) {
    if (text_id < 0 || text_id >= static_cast<int64_t>(ids.size())) return false;
    *out = ids[static_cast<size_t>(text_id)];
    return true;
  };
  while (std::getline(in, item, ';')) {
    ++item_number;
    if (item.empty()) continue;
    std::istringstream words(item);
    std::string kind;
    words >> kind;
    int32_t node = -1;
    if (kind == "input") {
      int slot = -1;
      if (!(words >> slot)) return bad("expected 'input <variable>'");
      FUSEDATTN_RETURN_IF_ERROR(builder->Input(slot, &node));
      ids.push_back(node);
    } else if (kind == "const") {
      std::string word;
      double value = 0;
      if (!(words >> word) || !ParseConstant(word, &value))
        return bad("expected 'const <number>' (a hexadecimal float such as 0x1.ep+4, inf, -inf, "
                   "nan or nan:<16 hex digits of the bits>)");
      FUSEDATTN_RETURN_IF_ERROR(builder->Constant(value, &node));
      ids.push_back(node);
    } else if (kind == "tensor") {
      int dtype = -1, requires_grad = -1;
      uint32_t axes = 0;
      std::string hex, name;
      if (!(words >> dtype >> axes >> requires_grad >> hex) || !Unhex(hex, &name))
        return bad("expected 'tensor <dtype> <axes> <requires_grad> <name in hex>'");
      FUSEDATTN_RETURN_IF_ERROR(
          builder->Tensor(name.c_str(), dtype, axes, requires_grad, &node));
      ids.push_back(node);
      tensor_nodes.push_back(node);
    } else if (kind == "op") {
      std::string name;
      Op op;
      if (!(words >> name) || !OpByName(name, &op)) return bad("unknown operation");
      int32_t operands[3] = {-1, -1, -1};
      for (int a = 0; a < Arity(op); ++a) {
        int64_t text_id = -1;
        if (!(words >> text_id) || !node_of(text_id, &operands[a]))
          return bad("an operand is not an earlier node");
      }
      FUSEDATTN_RETURN_IF_ERROR(builder->Operation(ApiOpcode(op), Arity(op), operands, &node));
      ids.push_back(node);
    } else if (kind == "score" || kind == "mask" || kind == "grad_score") {
      int64_t text_id = -1;
      if (!(words >> text_id) || !node_of(text_id, &node)) return bad("not a node");
      if (kind == "score") {
        FUSEDATTN_RETURN_IF_ERROR(builder->SetScore(node));
      } else if (kind == "mask") {
        FUSEDATTN_RETURN_IF_ERROR(builder->SetMask(node));
      } else {
        int32_t s = -1;
        FUSEDATTN_RETURN_IF_ERROR(builder->Input(FUSEDATTN_SCORE_MOD_SCORE, &s));
        FUSEDATTN_RETURN_IF_ERROR(builder->SetGradient(s, node));
      }
    } else if (kind == "grad_tensor") {
      int64_t k = -1, text_id = -1;
      if (!(words >> k >> text_id) || k < 0 || k >= static_cast<int64_t>(tensor_nodes.size()) ||
          !node_of(text_id, &node))
        return bad("expected 'grad_tensor <tensor> <node>'");
      FUSEDATTN_RETURN_IF_ERROR(builder->SetGradient(tensor_nodes[static_cast<size_t>(k)], node));
    } else {
      return bad("unknown item kind");
    }
    std::string extra;
    if (words >> extra) return bad("unexpected words at the end of the item");
  }
  return Status::Ok();
}

}  // namespace fusedattn::flex
