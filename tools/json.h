// A small JSON value for the program's --json output: null, booleans, numbers, strings, arrays
// and objects whose keys keep the order they were added in. Dump() writes it on one line, strings
// escaped per RFC 8259, non-finite numbers as null.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

namespace fusedattn::cli {

class Json {
 public:
  enum class Kind { kNull, kBool, kNumber, kInteger, kString, kArray, kObject };

  Json() = default;
  Json(std::nullptr_t) {}
  Json(bool v) : kind_(Kind::kBool), bool_(v) {}
  Json(int v) : kind_(Kind::kInteger), integer_(v) {}
  Json(int64_t v) : kind_(Kind::kInteger), integer_(v) {}
  Json(long long v) : kind_(Kind::kInteger), integer_(static_cast<int64_t>(v)) {}
  Json(size_t v) : kind_(Kind::kInteger), integer_(static_cast<int64_t>(v)) {}
  Json(double v) : kind_(Kind::kNumber), number_(v) {}
  Json(const char* v) : kind_(v ? Kind::kString : Kind::kNull), string_(v ? v : "") {}
  Json(std::string v) : kind_(Kind::kString), string_(std::move(v)) {}

  static Json Array() {
    Json j;
    j.kind_ = Kind::kArray;
    return j;
  }
  static Json Object() {
    Json j;
    j.kind_ = Kind::kObject;
    return j;
  }

  // Arrays: append.
  Json& push(Json value) {
    items_.emplace_back(std::string(), std::move(value));
    return *this;
  }
  // Objects: set a key (replacing an earlier value of the same key, which keeps its place).
  Json& set(const std::string& key, Json value) {
    for (auto& item : items_)
      if (item.first == key) {
        item.second = std::move(value);
        return *this;
      }
    items_.emplace_back(key, std::move(value));
    return *this;
  }

  std::string Dump() const {
    std::string out;
    Write(&out);
    return out;
  }

 private:
  static void WriteString(const std::string& s, std::string* out) {
    out->push_back('"');
    for (unsigned char c : s) {
      switch (c) {
        case '"': *out += "\\\""; break;
        case '\\': *out += "\\\\"; break;
        case '\n': *out += "\\n"; break;
        case '\r': *out += "\\r"; break;
        case '\t': *out += "\\t"; break;
        case '\b': *out += "\\b"; break;
        case '\f': *out += "\\f"; break;
        default:
          if (c < 0x20) {
            char buf[8];
            std::snprintf(buf, sizeof buf, "\\u%04x", c);
            *out += buf;
          } else {
            out->push_back(static_cast<char>(c));
          }
      }
    }
    out->push_back('"');
  }

  void Write(std::string* out) const {
    switch (kind_) {
      case Kind::kNull: *out += "null"; return;
      case Kind::kBool: *out += bool_ ? "true" : "false"; return;
      case Kind::kInteger: *out += std::to_string(integer_); return;
      case Kind::kNumber: {
        if (!std::isfinite(number_)) {
          *out += "null";
          return;
        }
        char buf[32];
        std::snprintf(buf, sizeof buf, "%.17g", number_);
        *out += buf;
        return;
      }
      case Kind::kString: WriteString(string_, out); return;
      case Kind::kArray:
      case Kind::kObject: {
        const bool object = kind_ == Kind::kObject;
        out->push_back(object ? '{' : '[');
        for (size_t i = 0; i < items_.size(); ++i) {
          if (i) *out += ", ";
          if (object) {
            WriteString(items_[i].first, out);
            *out += ": ";
          }
          items_[i].second.Write(out);
        }
        out->push_back(object ? '}' : ']');
        return;
      }
    }
  }

  Kind kind_ = Kind::kNull;
  bool bool_ = false;
  int64_t integer_ = 0;
  double number_ = 0;
  std::string string_;
  std::vector<std::pair<std::string, Json>> items_;
};

}  // namespace fusedattn::cli
