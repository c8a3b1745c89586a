// Value: what a Jinja expression evaluates to, with Python's semantics as Jinja2 exposes them
// (undefined, None, bool, int, float, str, list/tuple, dict, namespace, callables). Strings are
// Texts and keep their provenance. Lists and dicts are immutable once built (the sandbox HF
// renders in forbids mutating them), so Values share them; a namespace is the one mutable object.
// Also the conversions every part of the interpreter needs: truthiness, equality, ordering,
// str(), repr() and HF's tojson. Values belong to one render (one thread).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <boost/json/fwd.hpp>

#include "tokenizer/jinja/text.h"

namespace dinfer::tokenizer::jinja {

// An error while parsing or rendering; the interpreter throws it (rendering is deeply recursive
// and any error ends it) and Template turns it into a Status at its boundary.
struct TemplateError {
  std::string message;
  int line = 0;  // 0: not known yet; the statement being run fills it in
};

template <typename... Args>
[[noreturn]] void Fail(fmt::format_string<Args...> f, Args&&... args) {
  throw TemplateError{fmt::format(f, std::forward<Args>(args)...)};
}

class Value;

struct Args {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> named;
};

struct ListData {
  std::vector<Value> items;
  bool tuple = false;  // only repr() tells them apart
  // What Jinja's map/select/... filters return: a Python generator, which iterates like a list
  // but is always true, has no len(), no items by index and no JSON form.
  bool generator = false;
};

// Insertion-ordered string-keyed dictionary (JSON objects, dict literals, namespaces).
struct DictData {
  std::vector<std::pair<Text, Value>> entries;
  const Value* Find(std::string_view key) const;
  void Set(Text key, Value value);  // replaces an existing key in place
};

struct CallableData {
  std::string name;
  std::function<Value(const Args&)> fn;
};

class Value {
 public:
  enum class Kind : uint8_t {
    kUndefined,
    kNone,
    kBool,
    kInt,
    kFloat,
    kString,
    kList,
    kDict,
    kNamespace,
    kCallable
  };

  Value() = default;  // undefined
  static Value Undefined(std::string_view name);
  static Value None();
  static Value Bool(bool b);
  static Value Int(int64_t i);
  static Value Float(double f);
  static Value String(Text t);
  static Value String(std::string s, bool trusted) { return String(Text(std::move(s), trusted)); }
  static Value List(std::vector<Value> items, bool tuple = false);
  static Value Generator(std::vector<Value> items);
  static Value Dict(DictData d);
  static Value Namespace(DictData d);
  static Value Callable(std::string name, std::function<Value(const Args&)> fn);
  // Untrusted, as everything the request carries.
  static Value FromJson(const boost::json::value& v);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_list() const { return kind_ == Kind::kList; }
  bool is_generator() const { return kind_ == Kind::kList && list().generator; }
  bool is_dict() const { return kind_ == Kind::kDict; }
  bool is_number() const {
    return kind_ == Kind::kInt || kind_ == Kind::kFloat || kind_ == Kind::kBool;
  }

  bool bool_value() const { return b_; }
  int64_t int_value() const { return kind_ == Kind::kBool ? (b_ ? 1 : 0) : i_; }
  double float_value() const;  // any number
  const Text& text() const { return *static_cast<const Text*>(p_.get()); }
  const ListData& list() const { return *static_cast<const ListData*>(p_.get()); }
  const DictData& dict() const { return *static_cast<const DictData*>(p_.get()); }
  // A namespace is created mutable (Value::Namespace); only its pointer is stored as const.
  DictData& ns() const { return *static_cast<DictData*>(const_cast<void*>(p_.get())); }
  const CallableData& callable() const { return *static_cast<const CallableData*>(p_.get()); }
  std::string_view undefined_name() const { return name_; }
  // Identity of lists, dicts, namespaces (the `sameas` test).
  const void* identity() const { return p_.get(); }

 private:
  Kind kind_ = Kind::kUndefined;
  bool b_ = false;
  int64_t i_ = 0;
  double f_ = 0.0;
  std::shared_ptr<const void> p_;
  std::string_view name_;  // an undefined value's name (points into the template's source)
};

// Python's type name ("str", "int", "NoneType", ...) for error messages.
std::string_view TypeName(const Value& v);
bool Truthy(const Value& v);
// Python ==: numbers across int/float/bool, deep for lists and dicts; undefined equals undefined.
bool Equal(const Value& a, const Value& b);
// Python <: numbers, strings (by code point), lists; anything else is a TypeError.
bool Less(const Value& a, const Value& b);
// Python str(); undefined is "". Strings keep their provenance; text made from other values is
// trusted only when every string it contains is.
Text ToText(const Value& v);
// Python repr() (lists and dicts print their items with it).
Text Repr(const Value& v);
// Python float repr ("1.0", "1e-05", "0.30000000000000004").
std::string FormatFloat(double f);

struct JsonOptions {
  int indent = -1;                            // -1: one line
  std::string item_separator, key_separator;  // empty: Python's defaults for the indent
  bool sort_keys = false;
};
// json.dumps(v, ensure_ascii=False, ...), as HF's tojson filter calls it.
Text ToJson(const Value& v, const JsonOptions& options);

// The items a for loop or a filter iterates: list items, dict keys, string characters; undefined
// is empty. Anything else is a TypeError.
std::vector<Value> Iterate(const Value& v);

}  // namespace dinfer::tokenizer::jinja
