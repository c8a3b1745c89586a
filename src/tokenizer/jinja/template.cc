// The evaluator: walks the parsed template with Jinja2's scoping (a for loop's body gets a fresh
// scope each iteration, `set` binds in the innermost loop/macro scope, macros see the template's
// top-level variables at call time) and Python's operator semantics.
#include "tokenizer/jinja/template.h"

#include <cmath>
#include <unordered_map>

#include "tokenizer/jinja/builtins.h"
#include "tokenizer/jinja/parser.h"

namespace dinfer::tokenizer::jinja {
namespace {

constexpr int kMaxCallDepth = 200;

[[noreturn]] void FailUndefined(const Value& v) {
  if (v.undefined_name().empty()) Fail("undefined value used");
  Fail("'{}' is undefined", v.undefined_name());
}

// Python ints are unbounded; ours stop at 64 bits.
template <typename Op>
Value IntOp(int64_t x, int64_t y, Op op) {
  int64_t r = 0;
  if (op(x, y, &r)) Fail("integer overflow");
  return Value::Int(r);
}

Value Arithmetic(const std::string& op, const Value& a, const Value& b) {
  if (op == "~") {
    Text t = ToText(a);
    t.Append(ToText(b));
    return Value::String(std::move(t));
  }
  if (a.is_undefined()) FailUndefined(a);
  if (b.is_undefined()) FailUndefined(b);
  const bool ints = a.is_number() && b.is_number() && a.kind() != Value::Kind::kFloat &&
                    b.kind() != Value::Kind::kFloat;
  if (a.is_number() && b.is_number()) {
    const int64_t x = a.int_value(), y = b.int_value();
    const double fx = a.float_value(), fy = b.float_value();
    auto add = [](int64_t a, int64_t b, int64_t* r) { return __builtin_add_overflow(a, b, r); };
    auto sub = [](int64_t a, int64_t b, int64_t* r) { return __builtin_sub_overflow(a, b, r); };
    auto mul = [](int64_t a, int64_t b, int64_t* r) { return __builtin_mul_overflow(a, b, r); };
    if (op == "+") return ints ? IntOp(x, y, add) : Value::Float(fx + fy);
    if (op == "-") return ints ? IntOp(x, y, sub) : Value::Float(fx - fy);
    if (op == "*") return ints ? IntOp(x, y, mul) : Value::Float(fx * fy);
    if (op == "/") {
      if (fy == 0.0) Fail("division by zero");
      return Value::Float(fx / fy);
    }
    if (op == "//" || op == "%") {
      if (ints ? y == 0 : fy == 0.0) Fail("integer division or modulo by zero");
      if (ints) {
        int64_t q = x / y, m = x % y;
        if (m != 0 && ((m < 0) != (y < 0))) {
          --q;
          m += y;
        }
        return Value::Int(op == "//" ? q : m);
      }
      if (op == "//") return Value::Float(std::floor(fx / fy));
      double m = std::fmod(fx, fy);
      if (m != 0.0 && ((m < 0) != (fy < 0))) m += fy;
      return Value::Float(m);
    }
    if (op == "**") {
      if (ints && y >= 0) {
        Value result = Value::Int(1);
        for (int64_t i = 0; i < y; ++i) result = IntOp(result.int_value(), x, mul);
        return result;
      }
      return Value::Float(std::pow(fx, fy));
    }
  }
  if (op == "+") {
    if (a.is_string() && b.is_string()) {
      Text t = a.text();
      t.Append(b.text());
      return Value::String(std::move(t));
    }
    if (a.is_list() && b.is_list() && a.list().tuple == b.list().tuple && !a.is_generator() &&
        !b.is_generator()) {
      std::vector<Value> items = a.list().items;
      items.insert(items.end(), b.list().items.begin(), b.list().items.end());
      return Value::List(std::move(items), a.list().tuple);
    }
    if (a.is_string()) Fail("can only concatenate str (not \"{}\") to str", TypeName(b));
    if (a.is_list()) Fail("can only concatenate list (not \"{}\") to list", TypeName(b));
  }
  if (op == "*") {
    const Value& seq = a.is_number() ? b : a;
    const Value& n = a.is_number() ? a : b;
    if ((seq.is_string() || (seq.is_list() && !seq.is_generator())) && n.is_number() &&
        n.kind() != Value::Kind::kFloat) {
      if (seq.is_string()) {
        Text t;
        for (int64_t i = 0; i < n.int_value(); ++i) t.Append(seq.text());
        return Value::String(std::move(t));
      }
      std::vector<Value> items;
      for (int64_t i = 0; i < n.int_value(); ++i) {
        items.insert(items.end(), seq.list().items.begin(), seq.list().items.end());
      }
      return Value::List(std::move(items), seq.list().tuple);
    }
  }
  if (op == "%" && a.is_string()) {
    if (b.is_list() && b.list().tuple)
      return Value::String(PercentFormat(a.text(), b.list().items, false));
    return Value::String(
        PercentFormat(a.text(), {b}, (b.is_list() && !b.is_generator()) || b.is_dict()));
  }
  Fail("unsupported operand type(s) for {}: '{}' and '{}'", op, TypeName(a), TypeName(b));
}

bool Compare(const std::string& op, const Value& a, const Value& b) {
  if (op == "==") return Equal(a, b);
  if (op == "!=") return !Equal(a, b);
  if (op == "in") return Contains(b, a);
  if (op == "notin") return !Contains(b, a);
  if (a.is_undefined()) FailUndefined(a);
  if (b.is_undefined()) FailUndefined(b);
  if (op == "<") return Less(a, b);
  if (op == ">") return Less(b, a);
  if (op == "<=") return !Less(b, a);
  return !Less(a, b);  // >=
}

class Evaluator {
 public:
  explicit Evaluator(const std::vector<std::pair<std::string, Value>>& globals) {
    for (const auto& [name, value] : globals) root_.vars[name] = value;
  }

  Text Run(const Body& body) {
    Text out;
    out_ = &out;
    ExecBody(body, &root_);
    return out;
  }

 private:
  struct Scope {
    Scope* parent = nullptr;
    std::unordered_map<std::string, Value> vars;
  };
  enum class Flow { kNormal, kBreak, kContinue };

  Value Lookup(const std::string& name, Scope* scope) const {
    for (Scope* s = scope; s != nullptr; s = s->parent) {
      const auto it = s->vars.find(name);
      if (it != s->vars.end()) return it->second;
    }
    if (Value g = GlobalFunction(name); !g.is_undefined()) return g;
    return Value::Undefined(name);
  }

  Text Capture(const Body& body, Scope* scope) {
    Text captured;
    Text* saved = out_;
    out_ = &captured;
    ExecBody(body, scope);
    out_ = saved;
    return captured;
  }

  Flow ExecBody(const Body& body, Scope* scope) {
    for (const StmtPtr& stmt : body) {
      Flow flow = Flow::kNormal;
      try {
        flow = Exec(*stmt, scope);
      } catch (TemplateError& e) {
        if (e.line == 0) e.line = stmt->line;
        throw;
      }
      if (flow != Flow::kNormal) return flow;
    }
    return Flow::kNormal;
  }

  void Assign(const Stmt& s, Value value, Scope* scope) {
    if (!s.attr.empty()) {
      Value ns = Lookup(s.targets[0], scope);
      if (ns.kind() != Value::Kind::kNamespace) {
        Fail("cannot assign attribute on non-namespace object '{}'", s.targets[0]);
      }
      ns.ns().Set(Text(s.attr, true), std::move(value));
      return;
    }
    Bind(s.targets, value, scope);
  }

  static void Bind(const std::vector<std::string>& targets, const Value& value, Scope* scope) {
    if (targets.size() == 1) {
      scope->vars[targets[0]] = value;
      return;
    }
    const std::vector<Value> items = Iterate(value);
    if (items.size() != targets.size()) {
      Fail("{} values to unpack (expected {}, got {})",
           items.size() > targets.size() ? "too many" : "not enough", targets.size(), items.size());
    }
    for (size_t i = 0; i < targets.size(); ++i) scope->vars[targets[i]] = items[i];
  }

  Flow Exec(const Stmt& s, Scope* scope) {
    switch (s.kind) {
      case Stmt::Kind::kData:
        out_->Append(s.text, /*trusted=*/true);
        return Flow::kNormal;
      case Stmt::Kind::kOutput:
        out_->Append(ToText(Eval(*s.expr, scope)));
        return Flow::kNormal;
      case Stmt::Kind::kIf:
        for (const auto& [cond, body] : s.branches) {
          if (Truthy(Eval(*cond, scope))) return ExecBody(body, scope);
        }
        return ExecBody(s.else_body, scope);
      case Stmt::Kind::kFor:
        ExecFor(s, scope);
        return Flow::kNormal;
      case Stmt::Kind::kSet:
        Assign(s, Eval(*s.expr, scope), scope);
        return Flow::kNormal;
      case Stmt::Kind::kSetBlock: {
        Value v = Value::String(Capture(s.body, scope));
        if (s.filter) v = Eval(*s.filter, scope, &v);
        Assign(s, std::move(v), scope);
        return Flow::kNormal;
      }
      case Stmt::Kind::kMacro:
        scope->vars[s.name] = Value::Callable(
            s.name, [this, &s](const Args& args) { return CallMacro(s, args, nullptr); });
        return Flow::kNormal;
      case Stmt::Kind::kCallBlock: {
        const Expr& call = *s.expr;
        Value callee = Eval(*call.children[0], scope);
        Args args = EvalArgs(call, scope);
        args.named.emplace_back(
            "caller", Value::Callable("caller", [this, &s, scope](const Args& caller_args) {
              return CallMacro(s, caller_args, scope);
            }));
        out_->Append(ToText(Call(callee, args)));
        return Flow::kNormal;
      }
      case Stmt::Kind::kFilterBlock: {
        const Value body = Value::String(Capture(s.body, scope));
        out_->Append(ToText(Eval(*s.expr, scope, &body)));
        return Flow::kNormal;
      }
      case Stmt::Kind::kWith: {
        Scope inner{scope, {}};
        for (const auto& [name, expr] : s.assignments) inner.vars[name] = Eval(*expr, scope);
        return ExecBody(s.body, &inner);
      }
      case Stmt::Kind::kScope:
        return ExecBody(s.body, scope);
      case Stmt::Kind::kBreak:
        return Flow::kBreak;
      case Stmt::Kind::kContinue:
        return Flow::kContinue;
    }
    return Flow::kNormal;
  }

  void ExecFor(const Stmt& s, Scope* scope) {
    std::vector<Value> items = Iterate(Eval(*s.expr, scope));
    if (s.filter) {
      std::vector<Value> kept;
      for (Value& item : items) {
        Scope probe{scope, {}};
        Bind(s.targets, item, &probe);
        if (Truthy(Eval(*s.filter, &probe))) kept.push_back(std::move(item));
      }
      items = std::move(kept);
    }
    if (items.empty()) {
      Scope inner{scope, {}};
      ExecBody(s.else_body, &inner);
      return;
    }
    const int64_t n = static_cast<int64_t>(items.size());
    for (int64_t i = 0; i < n; ++i) {
      Scope inner{scope, {}};
      Bind(s.targets, items[static_cast<size_t>(i)], &inner);
      inner.vars["loop"] = LoopObject(items, i);
      if (ExecBody(s.body, &inner) == Flow::kBreak) break;
    }
  }

  static Value LoopObject(const std::vector<Value>& items, int64_t i) {
    const int64_t n = static_cast<int64_t>(items.size());
    DictData loop;
    loop.entries.reserve(12);
    auto set = [&](const char* key, Value v) {
      loop.entries.emplace_back(Text(key, true), std::move(v));
    };
    set("index", Value::Int(i + 1));
    set("index0", Value::Int(i));
    set("revindex", Value::Int(n - i));
    set("revindex0", Value::Int(n - i - 1));
    set("first", Value::Bool(i == 0));
    set("last", Value::Bool(i == n - 1));
    set("length", Value::Int(n));
    set("depth", Value::Int(1));
    set("depth0", Value::Int(0));
    set("previtem", i > 0 ? items[static_cast<size_t>(i - 1)] : Value());
    set("nextitem", i + 1 < n ? items[static_cast<size_t>(i + 1)] : Value());
    set("cycle", Value::Callable("cycle", [i](const Args& args) {
          if (args.positional.empty()) Fail("no items for cycling given");
          return args.positional[static_cast<size_t>(i) % args.positional.size()];
        }));
    return Value::Dict(std::move(loop));
  }

  // A macro call, or (with `call_site`) a call block's `caller()`.
  Value CallMacro(const Stmt& s, const Args& args, Scope* call_site) {
    if (++depth_ > kMaxCallDepth) Fail("maximum recursion depth exceeded");
    Scope scope{call_site != nullptr ? call_site : &root_, {}};
    std::vector<Value> varargs;
    for (size_t i = 0; i < args.positional.size(); ++i) {
      if (i < s.params.size()) {
        scope.vars[s.params[i].name] = args.positional[i];
      } else {
        varargs.push_back(args.positional[i]);
      }
    }
    DictData kwargs;
    for (const auto& [name, value] : args.named) {
      bool is_param = false;
      for (const Param& p : s.params) is_param = is_param || p.name == name;
      if (is_param || name == "caller") {
        scope.vars[name] = value;
      } else {
        kwargs.Set(Text(name, false), value);
      }
    }
    for (const Param& p : s.params) {
      if (scope.vars.count(p.name)) continue;
      scope.vars[p.name] =
          p.default_value ? Eval(*p.default_value, &scope) : Value::Undefined(p.name);
    }
    if (!varargs.empty() && !s.catch_varargs) {
      Fail("macro '{}' takes not more than {} argument(s)", s.name, s.params.size());
    }
    if (!kwargs.entries.empty() && !s.catch_kwargs) {
      Fail("macro '{}' takes no keyword argument '{}'", s.name, kwargs.entries[0].first.str());
    }
    scope.vars["varargs"] = Value::List(std::move(varargs), /*tuple=*/true);
    scope.vars["kwargs"] = Value::Dict(std::move(kwargs));
    Text out = Capture(s.body, &scope);
    --depth_;
    return Value::String(std::move(out));
  }

  static Value Call(const Value& callee, const Args& args) {
    if (callee.kind() == Value::Kind::kCallable) return callee.callable().fn(args);
    if (callee.is_undefined()) FailUndefined(callee);
    Fail("'{}' object is not callable", TypeName(callee));
  }

  // The arguments of a call, filter or test: children from `first` on, and the named ones.
  Args EvalArgs(const Expr& e, Scope* scope, size_t first = 1) {
    Args args;
    for (size_t i = first; i < e.children.size(); ++i) {
      args.positional.push_back(Eval(*e.children[i], scope));
    }
    for (const auto& [name, expr] : e.named) args.named.emplace_back(name, Eval(*expr, scope));
    return args;
  }

  // `block_input` is what a filter with no input applies to (filter blocks, set blocks).
  Value Eval(const Expr& e, Scope* scope, const Value* block_input = nullptr) {
    try {
      return EvalInner(e, scope, block_input);
    } catch (TemplateError& err) {
      if (err.line == 0) err.line = e.line;
      throw;
    }
  }

  Value EvalInner(const Expr& e, Scope* scope, const Value* block_input) {
    switch (e.kind) {
      case Expr::Kind::kLiteral:
        return e.literal;
      case Expr::Kind::kName:
        return Lookup(e.name, scope);
      case Expr::Kind::kList:
      case Expr::Kind::kTuple: {
        std::vector<Value> items;
        items.reserve(e.children.size());
        for (const ExprPtr& c : e.children) items.push_back(Eval(*c, scope));
        return Value::List(std::move(items), e.kind == Expr::Kind::kTuple);
      }
      case Expr::Kind::kDict: {
        DictData d;
        for (size_t i = 0; i + 1 < e.children.size(); i += 2) {
          Value key = Eval(*e.children[i], scope);
          if (!key.is_string()) Fail("dict keys must be strings here, not '{}'", TypeName(key));
          d.Set(key.text(), Eval(*e.children[i + 1], scope));
        }
        return Value::Dict(std::move(d));
      }
      case Expr::Kind::kGetAttr: {
        const Value obj = Eval(*e.children[0], scope);
        if (obj.is_undefined()) FailUndefined(obj);
        Value v = GetAttr(obj, e.name);
        return v.is_undefined() ? Value::Undefined(e.name) : v;
      }
      case Expr::Kind::kGetItem: {
        const Value obj = Eval(*e.children[0], scope);
        if (obj.is_undefined()) FailUndefined(obj);
        return GetItem(obj, Eval(*e.children[1], scope));
      }
      case Expr::Kind::kSlice: {
        const Value obj = Eval(*e.children[0], scope);
        if (obj.is_undefined()) FailUndefined(obj);
        auto bound = [&](size_t i) {
          return e.children[i] ? Eval(*e.children[i], scope) : Value::None();
        };
        return Slice(obj, bound(1), bound(2), bound(3));
      }
      case Expr::Kind::kCall: {
        const Value callee = Eval(*e.children[0], scope);
        return Call(callee, EvalArgs(e, scope));
      }
      case Expr::Kind::kFilter: {
        const Value input = e.children[0] ? Eval(*e.children[0], scope, block_input)
                                          : (block_input ? *block_input : Value());
        return CallFilter(e.name, input, EvalArgs(e, scope));
      }
      case Expr::Kind::kTest: {
        const Value input = Eval(*e.children[0], scope);
        return Value::Bool(CallTest(e.name, input, EvalArgs(e, scope)) != e.negated);
      }
      case Expr::Kind::kNegate:
      case Expr::Kind::kPlus: {
        const Value v = Eval(*e.children[0], scope);
        if (v.is_undefined()) FailUndefined(v);
        if (!v.is_number()) {
          Fail("bad operand type for unary {}: '{}'", e.kind == Expr::Kind::kNegate ? '-' : '+',
               TypeName(v));
        }
        if (e.kind == Expr::Kind::kPlus) {
          return v.kind() == Value::Kind::kFloat ? v : Value::Int(v.int_value());
        }
        return v.kind() == Value::Kind::kFloat ? Value::Float(-v.float_value())
                                               : Value::Int(-v.int_value());
      }
      case Expr::Kind::kNot:
        return Value::Bool(!Truthy(Eval(*e.children[0], scope)));
      case Expr::Kind::kAnd: {
        Value left = Eval(*e.children[0], scope);
        return Truthy(left) ? Eval(*e.children[1], scope) : left;
      }
      case Expr::Kind::kOr: {
        Value left = Eval(*e.children[0], scope);
        return Truthy(left) ? left : Eval(*e.children[1], scope);
      }
      case Expr::Kind::kBinary:
        return Arithmetic(e.name, Eval(*e.children[0], scope), Eval(*e.children[1], scope));
      case Expr::Kind::kCompare: {
        Value left = Eval(*e.children[0], scope);
        for (size_t i = 0; i < e.ops.size(); ++i) {
          Value right = Eval(*e.children[i + 1], scope);
          if (!Compare(e.ops[i], left, right)) return Value::Bool(false);
          left = std::move(right);
        }
        return Value::Bool(true);
      }
      case Expr::Kind::kCondition:
        if (Truthy(Eval(*e.children[1], scope))) return Eval(*e.children[0], scope);
        return e.children[2] ? Eval(*e.children[2], scope) : Value();
    }
    return Value();
  }

  Scope root_;
  Text* out_ = nullptr;
  int depth_ = 0;
};

}  // namespace

std::shared_ptr<const Template> Template::Parse(std::string_view source) {
  auto t = std::make_shared<Template>();
  t->body_ = ParseTemplate(source);
  return t;
}

Text Template::Render(const std::vector<std::pair<std::string, Value>>& globals) const {
  return Evaluator(globals).Run(body_);
}

namespace {

bool IsMember(const Expr& e, std::string_view name) {
  if (e.kind == Expr::Kind::kGetAttr) return e.name == name;
  if (e.kind != Expr::Kind::kGetItem) return false;
  const Expr& key = *e.children[1];
  return key.kind == Expr::Kind::kLiteral && key.literal.is_string() &&
         key.literal.text().str() == name;
}

// The iterable of a for loop, or what a filter chain over it starts from (`x.content|list`).
const Expr& LoopSource(const Expr& e) {
  const Expr* s = &e;
  while (s->kind == Expr::Kind::kFilter && s->children[0]) s = s->children[0].get();
  return *s;
}

bool BodyLoopsOver(const Body& body, std::string_view name) {
  for (const StmtPtr& s : body) {
    if (s->kind == Stmt::Kind::kFor && IsMember(LoopSource(*s->expr), name)) return true;
    if (BodyLoopsOver(s->body, name) || BodyLoopsOver(s->else_body, name)) return true;
    for (const auto& [cond, b] : s->branches) {
      if (BodyLoopsOver(b, name)) return true;
    }
  }
  return false;
}

}  // namespace

bool Template::LoopsOver(std::string_view name) const { return BodyLoopsOver(body_, name); }

}  // namespace dinfer::tokenizer::jinja
