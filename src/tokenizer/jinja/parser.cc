#include "tokenizer/jinja/parser.h"

#include <initializer_list>

#include "tokenizer/jinja/lexer.h"

namespace dinfer::tokenizer::jinja {
namespace {

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : tokens_(std::move(tokens)) {}

  Body ParseAll() {
    Body body = ParseBody({});
    if (Cur().type != TokenType::kEnd) {
      Error(fmt::format("unexpected '{}'", Cur().value));
    }
    return body;
  }

 private:
  const Token& Cur() const { return tokens_[pos_]; }
  const Token& Peek(size_t n = 1) const { return tokens_[std::min(pos_ + n, tokens_.size() - 1)]; }
  void Next() {
    if (pos_ + 1 < tokens_.size()) ++pos_;
  }
  int Line() const { return Cur().line; }

  [[noreturn]] void Error(std::string message) const {
    throw TemplateError{fmt::format("{} (column {})", message, Cur().column), Cur().line};
  }

  static std::string Describe(const Token& t) {
    switch (t.type) {
      case TokenType::kEnd:
        return "end of template";
      case TokenType::kBlockEnd:
        return "end of statement block";
      case TokenType::kVariableEnd:
        return "end of print statement";
      case TokenType::kData:
        return "template data";
      default:
        return t.value;
    }
  }

  bool IsOp(std::string_view op) const {
    return Cur().type == TokenType::kOperator && Cur().value == op;
  }
  bool IsName(std::string_view name) const {
    return Cur().type == TokenType::kName && Cur().value == name;
  }
  bool SkipOp(std::string_view op) {
    if (!IsOp(op)) return false;
    Next();
    return true;
  }
  bool SkipName(std::string_view name) {
    if (!IsName(name)) return false;
    Next();
    return true;
  }
  void ExpectOp(std::string_view op) {
    if (!SkipOp(op)) Error(fmt::format("expected '{}', got '{}'", op, Describe(Cur())));
  }
  void ExpectName(std::string_view name) {
    if (!SkipName(name)) Error(fmt::format("expected '{}', got '{}'", name, Describe(Cur())));
  }
  std::string ExpectIdentifier() {
    if (Cur().type != TokenType::kName) {
      Error(fmt::format("expected a name, got '{}'", Describe(Cur())));
    }
    std::string name = Cur().value;
    Next();
    return name;
  }
  void ExpectBlockEnd() {
    if (Cur().type != TokenType::kBlockEnd) {
      Error(fmt::format("expected end of statement block, got '{}'", Describe(Cur())));
    }
    Next();
  }

  // Statements until a block tag named in `ends` (left as the current token) or the end.
  Body ParseBody(std::initializer_list<std::string_view> ends) {
    Body body;
    while (true) {
      const Token& t = Cur();
      if (t.type == TokenType::kEnd) {
        if (ends.size() > 0) {
          Error(fmt::format("unexpected end of template, expected '{}'", *ends.begin()));
        }
        return body;
      }
      if (t.type == TokenType::kData) {
        auto s = std::make_unique<Stmt>(Stmt::Kind::kData, t.line);
        s->text = t.value;
        body.push_back(std::move(s));
        Next();
      } else if (t.type == TokenType::kVariableBegin) {
        Next();
        auto s = std::make_unique<Stmt>(Stmt::Kind::kOutput, Line());
        s->expr = ParseTuple(true, {});
        if (Cur().type != TokenType::kVariableEnd) {
          Error(fmt::format("expected end of print statement, got '{}'", Describe(Cur())));
        }
        Next();
        body.push_back(std::move(s));
      } else if (t.type == TokenType::kBlockBegin) {
        const Token& tag = Peek();
        if (tag.type != TokenType::kName) Error("expected a statement name after '{%'");
        for (std::string_view end : ends) {
          if (tag.value == end) {
            Next();  // leave the tag name current
            return body;
          }
        }
        Next();
        body.push_back(ParseStatement());
      } else {
        Error(fmt::format("unexpected '{}'", Describe(t)));
      }
    }
  }

  StmtPtr ParseStatement() {
    const std::string tag = Cur().value;
    const int line = Line();
    Next();
    if (tag == "if") return ParseIf(line);
    if (tag == "for") return ParseFor(line);
    if (tag == "set") return ParseSet(line);
    if (tag == "macro") return ParseMacro(line);
    if (tag == "call") return ParseCallBlock(line);
    if (tag == "filter") return ParseFilterBlock(line);
    if (tag == "with") return ParseWith(line);
    if (tag == "generation") {
      auto s = std::make_unique<Stmt>(Stmt::Kind::kScope, line);
      ExpectBlockEnd();
      s->body = ParseBlockBody("endgeneration");
      return s;
    }
    if (tag == "break" || tag == "continue") {
      if (loop_depth_ == 0) Error(fmt::format("'{}' outside of a loop", tag));
      ExpectBlockEnd();
      return std::make_unique<Stmt>(tag == "break" ? Stmt::Kind::kBreak : Stmt::Kind::kContinue,
                                    line);
    }
    Error(fmt::format("encountered unknown tag '{}'", tag));
  }

  // The body of a block closed by `end`; consumes the end tag.
  Body ParseBlockBody(std::string_view end) {
    Body body = ParseBody({end});
    Next();
    ExpectBlockEnd();
    return body;
  }

  StmtPtr ParseIf(int line) {
    auto s = std::make_unique<Stmt>(Stmt::Kind::kIf, line);
    while (true) {
      ExprPtr cond = ParseTuple(false, {});
      ExpectBlockEnd();
      Body body = ParseBody({"elif", "else", "endif"});
      s->branches.emplace_back(std::move(cond), std::move(body));
      const std::string tag = Cur().value;
      Next();
      if (tag == "elif") continue;
      if (tag == "else") {
        ExpectBlockEnd();
        s->else_body = ParseBlockBody("endif");
      } else {
        ExpectBlockEnd();
      }
      return s;
    }
  }

  std::vector<std::string> ParseTargets(std::string_view end_name) {
    std::vector<std::string> targets;
    const bool paren = SkipOp("(");
    while (true) {
      targets.push_back(ExpectIdentifier());
      if (!SkipOp(",")) break;
      if (IsName(end_name) || IsOp(")")) break;
    }
    if (paren) ExpectOp(")");
    return targets;
  }

  StmtPtr ParseFor(int line) {
    auto s = std::make_unique<Stmt>(Stmt::Kind::kFor, line);
    s->targets = ParseTargets("in");
    ExpectName("in");
    s->expr = ParseTuple(false, {"recursive"});
    if (SkipName("if")) s->filter = ParseExpression(true);
    if (IsName("recursive")) Error("recursive loops are not supported");
    ExpectBlockEnd();
    ++loop_depth_;
    s->body = ParseBody({"endfor", "else"});
    --loop_depth_;
    const std::string tag = Cur().value;
    Next();
    ExpectBlockEnd();
    if (tag == "else") s->else_body = ParseBlockBody("endfor");
    return s;
  }

  StmtPtr ParseSet(int line) {
    auto s = std::make_unique<Stmt>(Stmt::Kind::kSet, line);
    if (Cur().type == TokenType::kName && Peek().type == TokenType::kOperator &&
        Peek().value == ".") {
      s->targets.push_back(ExpectIdentifier());
      Next();
      s->attr = ExpectIdentifier();
    } else {
      s->targets = ParseTargets("");
    }
    if (SkipOp("=")) {
      s->expr = ParseTuple(true, {});
      ExpectBlockEnd();
      return s;
    }
    s->kind = Stmt::Kind::kSetBlock;
    if (IsOp("|")) s->filter = ParseFilters(nullptr);
    ExpectBlockEnd();
    s->body = ParseBlockBody("endset");
    return s;
  }

  std::vector<Param> ParseSignature() {
    std::vector<Param> params;
    ExpectOp("(");
    while (!IsOp(")")) {
      if (!params.empty()) ExpectOp(",");
      if (IsOp(")")) break;
      Param p;
      p.name = ExpectIdentifier();
      if (SkipOp("=")) p.default_value = ParseExpression(true);
      params.push_back(std::move(p));
    }
    Next();
    return params;
  }

  StmtPtr ParseMacro(int line) {
    auto s = std::make_unique<Stmt>(Stmt::Kind::kMacro, line);
    s->name = ExpectIdentifier();
    s->params = ParseSignature();
    ExpectBlockEnd();
    const int saved = loop_depth_;
    loop_depth_ = 0;
    s->body = ParseBlockBody("endmacro");
    loop_depth_ = saved;
    s->catch_varargs = Reads(s->body, "varargs");
    s->catch_kwargs = Reads(s->body, "kwargs");
    return s;
  }

  // Whether any expression in `body` reads the variable `name`.
  static bool Reads(const Expr* e, std::string_view name) {
    if (e == nullptr) return false;
    if (e->kind == Expr::Kind::kName && e->name == name) return true;
    for (const ExprPtr& c : e->children) {
      if (Reads(c.get(), name)) return true;
    }
    for (const auto& [n, c] : e->named) {
      if (Reads(c.get(), name)) return true;
    }
    return false;
  }
  static bool Reads(const Body& body, std::string_view name) {
    for (const StmtPtr& s : body) {
      if (Reads(s->expr.get(), name) || Reads(s->filter.get(), name) || Reads(s->body, name) ||
          Reads(s->else_body, name)) {
        return true;
      }
      for (const auto& [cond, b] : s->branches) {
        if (Reads(cond.get(), name) || Reads(b, name)) return true;
      }
      for (const Param& p : s->params) {
        if (Reads(p.default_value.get(), name)) return true;
      }
      for (const auto& [n, e] : s->assignments) {
        if (Reads(e.get(), name)) return true;
      }
    }
    return false;
  }

  StmtPtr ParseCallBlock(int line) {
    auto s = std::make_unique<Stmt>(Stmt::Kind::kCallBlock, line);
    if (IsOp("(")) s->params = ParseSignature();
    s->expr = ParseExpression(true);
    if (s->expr->kind != Expr::Kind::kCall) Error("expected a call");
    ExpectBlockEnd();
    s->body = ParseBlockBody("endcall");
    return s;
  }

  StmtPtr ParseFilterBlock(int line) {
    auto s = std::make_unique<Stmt>(Stmt::Kind::kFilterBlock, line);
    s->expr = ParseFilters(nullptr, /*first_without_pipe=*/true);
    ExpectBlockEnd();
    s->body = ParseBlockBody("endfilter");
    return s;
  }

  StmtPtr ParseWith(int line) {
    auto s = std::make_unique<Stmt>(Stmt::Kind::kWith, line);
    while (Cur().type != TokenType::kBlockEnd) {
      if (!s->assignments.empty()) ExpectOp(",");
      std::string name = ExpectIdentifier();
      ExpectOp("=");
      s->assignments.emplace_back(std::move(name), ParseExpression(true));
    }
    ExpectBlockEnd();
    s->body = ParseBlockBody("endwith");
    return s;
  }

  // ---- expressions, loosest binding first ----

  bool IsTupleEnd(std::initializer_list<std::string_view> extra_end_names) const {
    const TokenType type = Cur().type;
    if (type == TokenType::kVariableEnd || type == TokenType::kBlockEnd ||
        type == TokenType::kEnd || IsOp(")")) {
      return true;
    }
    for (std::string_view name : extra_end_names) {
      if (IsName(name)) return true;
    }
    return false;
  }

  ExprPtr ParseTuple(bool with_condexpr, std::initializer_list<std::string_view> extra_end_names,
                     bool explicit_parens = false) {
    const int line = Line();
    std::vector<ExprPtr> items;
    bool is_tuple = false;
    while (true) {
      if (!items.empty()) ExpectOp(",");
      if (IsTupleEnd(extra_end_names)) break;
      items.push_back(ParseExpression(with_condexpr));
      if (!IsOp(",")) break;
      is_tuple = true;
    }
    if (!is_tuple) {
      if (!items.empty()) return std::move(items[0]);
      if (!explicit_parens) Error(fmt::format("expected an expression, got '{}'", Describe(Cur())));
    }
    auto e = std::make_unique<Expr>(Expr::Kind::kTuple, line);
    e->children = std::move(items);
    return e;
  }

  ExprPtr ParseExpression(bool with_condexpr) {
    return with_condexpr ? ParseCondition() : ParseOr();
  }

  ExprPtr ParseCondition() {
    ExprPtr expr = ParseOr();
    while (IsName("if")) {
      const int line = Line();
      Next();
      ExprPtr cond = ParseOr();
      ExprPtr otherwise = SkipName("else") ? ParseCondition() : nullptr;
      auto e = std::make_unique<Expr>(Expr::Kind::kCondition, line);
      e->children.push_back(std::move(expr));
      e->children.push_back(std::move(cond));
      e->children.push_back(std::move(otherwise));
      expr = std::move(e);
    }
    return expr;
  }

  ExprPtr Binary(Expr::Kind kind, std::string op, ExprPtr left, ExprPtr right, int line) {
    auto e = std::make_unique<Expr>(kind, line);
    e->name = std::move(op);
    e->children.push_back(std::move(left));
    e->children.push_back(std::move(right));
    return e;
  }

  ExprPtr ParseOr() {
    ExprPtr left = ParseAnd();
    while (IsName("or")) {
      const int line = Line();
      Next();
      left = Binary(Expr::Kind::kOr, "or", std::move(left), ParseAnd(), line);
    }
    return left;
  }

  ExprPtr ParseAnd() {
    ExprPtr left = ParseNot();
    while (IsName("and")) {
      const int line = Line();
      Next();
      left = Binary(Expr::Kind::kAnd, "and", std::move(left), ParseNot(), line);
    }
    return left;
  }

  ExprPtr ParseNot() {
    if (IsName("not")) {
      auto e = std::make_unique<Expr>(Expr::Kind::kNot, Line());
      Next();
      e->children.push_back(ParseNot());
      return e;
    }
    return ParseCompare();
  }

  ExprPtr ParseCompare() {
    const int line = Line();
    ExprPtr first = ParseMath1();
    std::vector<std::string> ops;
    std::vector<ExprPtr> operands;
    while (true) {
      if (Cur().type == TokenType::kOperator &&
          (Cur().value == "==" || Cur().value == "!=" || Cur().value == "<" ||
           Cur().value == "<=" || Cur().value == ">" || Cur().value == ">=")) {
        ops.push_back(Cur().value);
        Next();
      } else if (IsName("in")) {
        ops.push_back("in");
        Next();
      } else if (IsName("not") && Peek().type == TokenType::kName && Peek().value == "in") {
        ops.push_back("notin");
        Next();
        Next();
      } else {
        break;
      }
      operands.push_back(ParseMath1());
    }
    if (ops.empty()) return first;
    auto e = std::make_unique<Expr>(Expr::Kind::kCompare, line);
    e->children.push_back(std::move(first));
    for (auto& o : operands) e->children.push_back(std::move(o));
    e->ops = std::move(ops);
    return e;
  }

  ExprPtr ParseMath1() {
    ExprPtr left = ParseConcat();
    while (IsOp("+") || IsOp("-")) {
      const std::string op = Cur().value;
      const int line = Line();
      Next();
      left = Binary(Expr::Kind::kBinary, op, std::move(left), ParseConcat(), line);
    }
    return left;
  }

  ExprPtr ParseConcat() {
    ExprPtr left = ParseMath2();
    while (IsOp("~")) {
      const int line = Line();
      Next();
      left = Binary(Expr::Kind::kBinary, "~", std::move(left), ParseMath2(), line);
    }
    return left;
  }

  ExprPtr ParseMath2() {
    ExprPtr left = ParsePow();
    while (IsOp("*") || IsOp("/") || IsOp("//") || IsOp("%")) {
      const std::string op = Cur().value;
      const int line = Line();
      Next();
      left = Binary(Expr::Kind::kBinary, op, std::move(left), ParsePow(), line);
    }
    return left;
  }

  ExprPtr ParsePow() {
    ExprPtr left = ParseUnary(true);
    while (IsOp("**")) {
      const int line = Line();
      Next();
      left = Binary(Expr::Kind::kBinary, "**", std::move(left), ParseUnary(true), line);
    }
    return left;
  }

  ExprPtr ParseUnary(bool with_filter) {
    ExprPtr node;
    if (IsOp("-") || IsOp("+")) {
      node = std::make_unique<Expr>(IsOp("-") ? Expr::Kind::kNegate : Expr::Kind::kPlus, Line());
      Next();
      node->children.push_back(ParseUnary(false));
    } else {
      node = ParsePrimary();
    }
    node = ParsePostfix(std::move(node));
    if (with_filter) node = ParseFilterExpr(std::move(node));
    return node;
  }

  ExprPtr ParsePrimary() {
    const Token& t = Cur();
    const int line = t.line;
    auto literal = [&](Value v) {
      auto e = std::make_unique<Expr>(Expr::Kind::kLiteral, line);
      e->literal = std::move(v);
      return e;
    };
    switch (t.type) {
      case TokenType::kName: {
        const std::string name = t.value;
        Next();
        if (name == "true" || name == "True") return literal(Value::Bool(true));
        if (name == "false" || name == "False") return literal(Value::Bool(false));
        if (name == "none" || name == "None") return literal(Value::None());
        auto e = std::make_unique<Expr>(Expr::Kind::kName, line);
        e->name = name;
        return e;
      }
      case TokenType::kString: {
        std::string s;
        while (Cur().type == TokenType::kString) {
          s += Cur().value;  // adjacent literals concatenate
          Next();
        }
        return literal(Value::String(std::move(s), /*trusted=*/true));
      }
      case TokenType::kInteger: {
        const int64_t v = t.int_value;
        Next();
        return literal(Value::Int(v));
      }
      case TokenType::kFloat: {
        const double v = t.float_value;
        Next();
        return literal(Value::Float(v));
      }
      case TokenType::kOperator:
        if (t.value == "(") {
          Next();
          ExprPtr e = ParseTuple(true, {}, /*explicit_parens=*/true);
          ExpectOp(")");
          return e;
        }
        if (t.value == "[") return ParseList();
        if (t.value == "{") return ParseDict();
        break;
      default:
        break;
    }
    Error(fmt::format("unexpected '{}'", Describe(t)));
  }

  ExprPtr ParseList() {
    auto e = std::make_unique<Expr>(Expr::Kind::kList, Line());
    ExpectOp("[");
    while (!IsOp("]")) {
      if (!e->children.empty()) ExpectOp(",");
      if (IsOp("]")) break;
      e->children.push_back(ParseExpression(true));
    }
    Next();
    return e;
  }

  ExprPtr ParseDict() {
    auto e = std::make_unique<Expr>(Expr::Kind::kDict, Line());
    ExpectOp("{");
    while (!IsOp("}")) {
      if (!e->children.empty()) ExpectOp(",");
      if (IsOp("}")) break;
      e->children.push_back(ParseExpression(true));
      ExpectOp(":");
      e->children.push_back(ParseExpression(true));
    }
    Next();
    return e;
  }

  ExprPtr ParsePostfix(ExprPtr node) {
    while (true) {
      if (IsOp(".")) {
        const int line = Line();
        Next();
        if (Cur().type == TokenType::kInteger) {
          auto e = std::make_unique<Expr>(Expr::Kind::kGetItem, line);
          auto index = std::make_unique<Expr>(Expr::Kind::kLiteral, line);
          index->literal = Value::Int(Cur().int_value);
          Next();
          e->children.push_back(std::move(node));
          e->children.push_back(std::move(index));
          node = std::move(e);
        } else {
          auto e = std::make_unique<Expr>(Expr::Kind::kGetAttr, line);
          e->name = ExpectIdentifier();
          e->children.push_back(std::move(node));
          node = std::move(e);
        }
      } else if (IsOp("[")) {
        node = ParseSubscript(std::move(node));
      } else if (IsOp("(")) {
        node = ParseCall(std::move(node));
      } else {
        return node;
      }
    }
  }

  ExprPtr ParseSubscript(ExprPtr node) {
    const int line = Line();
    ExpectOp("[");
    std::vector<ExprPtr> parts(3);
    bool is_slice = false;
    size_t part = 0;
    while (!IsOp("]")) {
      if (IsOp(":")) {
        is_slice = true;
        if (++part > 2) Error("invalid slice");
        Next();
        continue;
      }
      if (parts[part]) Error("expected ']' or ':'");
      parts[part] = ParseExpression(true);
    }
    Next();
    auto e = std::make_unique<Expr>(is_slice ? Expr::Kind::kSlice : Expr::Kind::kGetItem, line);
    e->children.push_back(std::move(node));
    if (!is_slice) {
      if (!parts[0]) Error("expected an index");
      e->children.push_back(std::move(parts[0]));
    } else {
      for (auto& p : parts) e->children.push_back(std::move(p));
    }
    return e;
  }

  // `(positional..., name=value...)` into e->children (after what is already there) and e->named.
  void ParseArgs(Expr* e) {
    ExpectOp("(");
    bool first = true;
    while (!IsOp(")")) {
      if (!first) ExpectOp(",");
      first = false;
      if (IsOp(")")) break;
      if (IsOp("*") || IsOp("**")) Error("*args and **kwargs in calls are not supported");
      if (Cur().type == TokenType::kName && Peek().type == TokenType::kOperator &&
          Peek().value == "=") {
        std::string name = Cur().value;
        Next();
        Next();
        e->named.emplace_back(std::move(name), ParseExpression(true));
      } else {
        if (!e->named.empty()) Error("positional argument after keyword argument");
        e->children.push_back(ParseExpression(true));
      }
    }
    Next();
  }

  ExprPtr ParseCall(ExprPtr callee) {
    auto e = std::make_unique<Expr>(Expr::Kind::kCall, Line());
    e->children.push_back(std::move(callee));
    ParseArgs(e.get());
    return e;
  }

  std::string ParseDottedName() {
    std::string name = ExpectIdentifier();
    while (IsOp(".") && Peek().type == TokenType::kName) {
      Next();
      name += "." + ExpectIdentifier();
    }
    return name;
  }

  // `| f(args) | g ...` applied to `input` (null in filter blocks and set blocks).
  ExprPtr ParseFilters(ExprPtr input, bool first_without_pipe = false) {
    bool first = true;
    while (true) {
      if (!(first && first_without_pipe) && !SkipOp("|")) break;
      first = false;
      auto e = std::make_unique<Expr>(Expr::Kind::kFilter, Line());
      e->name = ParseDottedName();
      e->children.push_back(std::move(input));
      if (IsOp("(")) ParseArgs(e.get());
      input = std::move(e);
      if (!IsOp("|")) break;
    }
    return input;
  }

  ExprPtr ParseFilterExpr(ExprPtr node) {
    while (true) {
      if (IsOp("|")) {
        node = ParseFilters(std::move(node));
      } else if (IsName("is")) {
        node = ParseTest(std::move(node));
      } else if (IsOp("(")) {
        node = ParseCall(std::move(node));
      } else {
        return node;
      }
    }
  }

  ExprPtr ParseTest(ExprPtr node) {
    auto e = std::make_unique<Expr>(Expr::Kind::kTest, Line());
    Next();  // is
    e->negated = SkipName("not");
    e->name = ParseDottedName();
    e->children.push_back(std::move(node));
    const Token& t = Cur();
    if (IsOp("(")) {
      ParseArgs(e.get());
    } else if ((t.type == TokenType::kName || t.type == TokenType::kString ||
                t.type == TokenType::kInteger || t.type == TokenType::kFloat || IsOp("[") ||
                IsOp("{")) &&
               !IsName("else") && !IsName("or") && !IsName("and")) {
      if (IsName("is")) Error("You cannot chain multiple tests with is");
      e->children.push_back(ParsePostfix(ParsePrimary()));
    }
    return e;
  }

  std::vector<Token> tokens_;
  size_t pos_ = 0;
  int loop_depth_ = 0;
};

}  // namespace

Body ParseTemplate(std::string_view source) { return Parser(Tokenize(source)).ParseAll(); }

}  // namespace dinfer::tokenizer::jinja
