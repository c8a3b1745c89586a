#include "structured/regex.h"

#include <algorithm>
#include <cctype>
#include <string>
#include <vector>

namespace dinfer::structured {
namespace {

struct Node {
  enum class Kind { kEmpty, kChars, kSeq, kAlt, kRepeat, kStart, kEnd } kind = Kind::kEmpty;
  Ranges cps;
  std::vector<int> kids;
  uint32_t min = 0, max = 0;
};

const Ranges& Digits() {
  static const Ranges r = {{'0', '9'}};
  return r;
}
const Ranges& Word() {
  static const Ranges r = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
  return r;
}
const Ranges& Space() {
  static const Ranges r = NormalizeRanges({{'\t', '\r'},
                                           {' ', ' '},
                                           {0xA0, 0xA0},
                                           {0x1680, 0x1680},
                                           {0x2000, 0x200A},
                                           {0x2028, 0x2029},
                                           {0x202F, 0x202F},
                                           {0x205F, 0x205F},
                                           {0x3000, 0x3000},
                                           {0xFEFF, 0xFEFF}});
  return r;
}

class Parser {
 public:
  explicit Parser(std::string_view p) : p_(p) {}

  StatusOr<int> Parse() {
    DINFER_ASSIGN_OR_RETURN(int root, ParseAlt(0));
    if (pos_ < p_.size()) return Error("unmatched ')'");
    return root;
  }
  std::vector<Node>& nodes() { return nodes_; }

 private:
  Status Error(std::string_view what) const {
    return InvalidArgument("regex /{}/: {} at offset {}", p_, what, pos_);
  }
  Status Unsupported(std::string_view what) const {
    return Unimplemented("regex /{}/: {} (offset {}) is not supported", p_, what, pos_);
  }
  int Add(Node n) {
    nodes_.push_back(std::move(n));
    return static_cast<int>(nodes_.size() - 1);
  }
  int AddChars(Ranges r) {
    Node n;
    n.kind = Node::Kind::kChars;
    n.cps = NormalizeRanges(std::move(r));
    return Add(std::move(n));
  }
  bool Eat(char c) {
    if (pos_ < p_.size() && p_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  bool AtEnd() const { return pos_ >= p_.size(); }
  char Peek() const { return p_[pos_]; }

  StatusOr<int> ParseAlt(int depth) {
    if (depth > 200) return Error("nesting too deep");
    std::vector<int> branches;
    while (true) {
      DINFER_ASSIGN_OR_RETURN(int seq, ParseSeq(depth));
      branches.push_back(seq);
      if (!Eat('|')) break;
    }
    if (branches.size() == 1) return branches[0];
    Node n;
    n.kind = Node::Kind::kAlt;
    n.kids = std::move(branches);
    return Add(std::move(n));
  }

  StatusOr<int> ParseSeq(int depth) {
    Node seq;
    seq.kind = Node::Kind::kSeq;
    while (!AtEnd() && Peek() != '|' && Peek() != ')') {
      DINFER_ASSIGN_OR_RETURN(int atom, ParseAtom(depth));
      DINFER_ASSIGN_OR_RETURN(atom, ParseQuantifiers(atom));
      seq.kids.push_back(atom);
    }
    if (seq.kids.empty()) return Add(Node{});
    if (seq.kids.size() == 1) return seq.kids[0];
    return Add(std::move(seq));
  }

  // {n}, {n,}, {n,m}; false (nothing consumed) when the brace is a literal.
  bool ParseBraces(uint32_t* min, uint32_t* max) {
    size_t i = pos_ + 1;
    auto number = [&](uint64_t* v) {
      const size_t start = i;
      *v = 0;
      while (i < p_.size() && p_[i] >= '0' && p_[i] <= '9') {
        *v = std::min<uint64_t>(*v * 10 + static_cast<uint64_t>(p_[i] - '0'), kUnbounded - 1);
        ++i;
      }
      return i > start;
    };
    uint64_t lo = 0, hi = 0;
    if (!number(&lo)) return false;
    if (i < p_.size() && p_[i] == '}') {
      hi = lo;
    } else if (i < p_.size() && p_[i] == ',') {
      ++i;
      if (i < p_.size() && p_[i] == '}') {
        hi = kUnbounded;
      } else if (!number(&hi) || i >= p_.size() || p_[i] != '}') {
        return false;
      }
    } else {
      return false;
    }
    pos_ = i + 1;
    *min = static_cast<uint32_t>(lo);
    *max = static_cast<uint32_t>(hi);
    return true;
  }

  StatusOr<int> ParseQuantifiers(int atom) {
    while (!AtEnd()) {
      uint32_t min, max;
      const char c = Peek();
      if (c == '*') {
        min = 0, max = kUnbounded;
        ++pos_;
      } else if (c == '+') {
        min = 1, max = kUnbounded;
        ++pos_;
      } else if (c == '?') {
        min = 0, max = 1;
        ++pos_;
      } else if (c == '{' && ParseBraces(&min, &max)) {
        if (min > max) return Error("quantifier {n,m} with n > m");
      } else {
        break;
      }
      Eat('?');  // lazy: the same language
      const Node::Kind k = nodes_[atom].kind;
      if (k == Node::Kind::kStart || k == Node::Kind::kEnd) return Error("quantified anchor");
      Node n;
      n.kind = Node::Kind::kRepeat;
      n.kids = {atom};
      n.min = min;
      n.max = max;
      atom = Add(std::move(n));
    }
    return atom;
  }

  StatusOr<int> ParseAtom(int depth) {
    const char c = Peek();
    switch (c) {
      case '(': {
        ++pos_;
        if (Eat('?')) {
          if (Eat(':')) {
          } else if (p_.substr(pos_).starts_with("<=") || p_.substr(pos_).starts_with("<!")) {
            return Unsupported("lookbehind");
          } else if (Eat('<')) {
            while (!AtEnd() && Peek() != '>') ++pos_;
            if (!Eat('>')) return Error("unterminated group name");
          } else if (Peek() == '=' || Peek() == '!') {
            return Unsupported("lookahead");
          } else {
            return Unsupported("group modifier (?");
          }
        }
        DINFER_ASSIGN_OR_RETURN(int inner, ParseAlt(depth + 1));
        if (!Eat(')')) return Error("missing ')'");
        return inner;
      }
      case '[':
        return ParseClass();
      case '.':
        ++pos_;
        return AddChars(ComplementCodepoints({{'\n', '\n'}, {'\r', '\r'}, {0x2028, 0x2029}}));
      case '^': {
        ++pos_;
        Node n;
        n.kind = Node::Kind::kStart;
        return Add(std::move(n));
      }
      case '$': {
        ++pos_;
        Node n;
        n.kind = Node::Kind::kEnd;
        return Add(std::move(n));
      }
      case '\\': {
        ++pos_;
        DINFER_ASSIGN_OR_RETURN(Ranges r, ParseEscape(false));
        return AddChars(std::move(r));
      }
      case '*':
      case '+':
      case '?':
        return Error("nothing to repeat");
      default: {
        std::string_view rest = p_.substr(pos_);
        const int32_t cp = DecodeUtf8(&rest);
        if (cp < 0) return Error("invalid UTF-8");
        pos_ = p_.size() - rest.size();
        return AddChars({{static_cast<uint32_t>(cp), static_cast<uint32_t>(cp)}});
      }
    }
  }

  StatusOr<uint32_t> Hex(size_t digits) {
    uint32_t v = 0;
    for (size_t i = 0; i < digits; ++i) {
      if (AtEnd() || !std::isxdigit(static_cast<unsigned char>(Peek()))) {
        return Error("bad hex escape");
      }
      const char c = p_[pos_++];
      v = v * 16 + static_cast<uint32_t>(c <= '9' ? c - '0' : (c | 0x20) - 'a' + 10);
    }
    return v;
  }

  // After a backslash: the set of characters the escape stands for.
  StatusOr<Ranges> ParseEscape(bool in_class) {
    if (AtEnd()) return Error("trailing backslash");
    const char c = p_[pos_++];
    auto one = [](uint32_t cp) { return Ranges{{cp, cp}}; };
    switch (c) {
      case 'd':
        return Digits();
      case 'D':
        return ComplementCodepoints(Digits());
      case 'w':
        return Word();
      case 'W':
        return ComplementCodepoints(Word());
      case 's':
        return Space();
      case 'S':
        return ComplementCodepoints(Space());
      case 't':
        return one('\t');
      case 'n':
        return one('\n');
      case 'r':
        return one('\r');
      case 'f':
        return one('\f');
      case 'v':
        return one('\v');
      case 'b':
        if (in_class) return one('\b');
        --pos_;
        return Unsupported("word boundary \\b");
      case 'B':
        --pos_;
        return Unsupported("word boundary \\B");
      case '0':
        if (!AtEnd() && std::isdigit(static_cast<unsigned char>(Peek()))) {
          return Unsupported("octal escape");
        }
        return one(0);
      case 'c':
        if (!AtEnd() && std::isalpha(static_cast<unsigned char>(Peek()))) {
          return one(static_cast<uint32_t>(p_[pos_++]) % 32);
        }
        return one('\\');
      case 'x': {
        DINFER_ASSIGN_OR_RETURN(uint32_t v, Hex(2));
        return one(v);
      }
      case 'u': {
        if (Eat('{')) {
          uint32_t v = 0;
          size_t n = 0;
          while (!AtEnd() && Peek() != '}') {
            DINFER_ASSIGN_OR_RETURN(uint32_t d, Hex(1));
            v = v * 16 + d;
            if (++n > 6 || v > kMaxCodepoint) return Error("code point out of range");
          }
          if (!Eat('}') || n == 0) return Error("bad \\u{...} escape");
          return one(v);
        }
        DINFER_ASSIGN_OR_RETURN(uint32_t v, Hex(4));
        if (v >= 0xD800 && v <= 0xDBFF && p_.substr(pos_).starts_with("\\u")) {
          const size_t save = pos_;
          pos_ += 2;
          auto low = Hex(4);
          if (low.ok() && *low >= 0xDC00 && *low <= 0xDFFF) {
            return one(0x10000 + ((v - 0xD800) << 10) + (*low - 0xDC00));
          }
          pos_ = save;
        }
        return one(v);
      }
      case 'p':
      case 'P':
        --pos_;
        return Unsupported("Unicode property escape \\p");
      case 'k':
        --pos_;
        return Unsupported("named backreference \\k");
      default:
        if (c >= '1' && c <= '9') {
          --pos_;
          return Unsupported("backreference");
        }
        // Identity escape (any other character, as ECMAScript's Annex B allows).
        --pos_;
        std::string_view rest = p_.substr(pos_);
        const int32_t cp = DecodeUtf8(&rest);
        if (cp < 0) return Error("invalid UTF-8");
        pos_ = p_.size() - rest.size();
        return one(static_cast<uint32_t>(cp));
    }
  }

  StatusOr<int> ParseClass() {
    ++pos_;  // [
    const bool negate = Eat('^');
    Ranges set;
    while (true) {
      if (AtEnd()) return Error("missing ']'");
      if (Peek() == ']') {
        ++pos_;
        break;
      }
      DINFER_ASSIGN_OR_RETURN(auto lo, ClassAtom());
      if (lo.single && !AtEnd() && Peek() == '-' && pos_ + 1 < p_.size() && p_[pos_ + 1] != ']') {
        ++pos_;
        DINFER_ASSIGN_OR_RETURN(auto hi, ClassAtom());
        if (hi.single) {
          if (hi.cp < lo.cp) return Error("class range out of order");
          set.emplace_back(lo.cp, hi.cp);
          continue;
        }
        // A class escape cannot end a range: the dash is literal (Annex B).
        set.insert(set.end(), lo.set.begin(), lo.set.end());
        set.emplace_back('-', '-');
        set.insert(set.end(), hi.set.begin(), hi.set.end());
        continue;
      }
      set.insert(set.end(), lo.set.begin(), lo.set.end());
    }
    set = NormalizeRanges(std::move(set));
    return AddChars(negate ? ComplementCodepoints(set) : set);
  }

  struct ClassItem {
    bool single = false;
    uint32_t cp = 0;
    Ranges set;
  };
  StatusOr<ClassItem> ClassAtom() {
    ClassItem item;
    if (Eat('\\')) {
      DINFER_ASSIGN_OR_RETURN(item.set, ParseEscape(true));
    } else {
      std::string_view rest = p_.substr(pos_);
      const int32_t cp = DecodeUtf8(&rest);
      if (cp < 0) return Error("invalid UTF-8");
      pos_ = p_.size() - rest.size();
      item.set = {{static_cast<uint32_t>(cp), static_cast<uint32_t>(cp)}};
    }
    if (item.set.size() == 1 && item.set[0].first == item.set[0].second) {
      item.single = true;
      item.cp = item.set[0].first;
    }
    return item;
  }

  std::string_view p_;
  size_t pos_ = 0;
  std::vector<Node> nodes_;
};

struct Branch {
  int body;  // -1: empty
  bool start = false, end = false;
};

// Splits the pattern into top-level alternatives with their anchors removed.
void Branches(std::vector<Node>& nodes, int id, bool start, bool end, std::vector<Branch>* out) {
  Node& n = nodes[id];
  if (n.kind == Node::Kind::kAlt) {
    for (int kid : n.kids) Branches(nodes, kid, start, end, out);
    return;
  }
  if (n.kind == Node::Kind::kStart || n.kind == Node::Kind::kEnd) {
    out->push_back({-1, start || n.kind == Node::Kind::kStart, end || n.kind == Node::Kind::kEnd});
    return;
  }
  if (n.kind != Node::Kind::kSeq) {
    out->push_back({id, start, end});
    return;
  }
  std::vector<int> kids = n.kids;
  size_t b = 0, e = kids.size();
  while (b < e && nodes[kids[b]].kind == Node::Kind::kStart) start = true, ++b;
  while (e > b && nodes[kids[e - 1]].kind == Node::Kind::kEnd) end = true, --e;
  if (e - b == 1 && nodes[kids[b]].kind == Node::Kind::kAlt) {
    Branches(nodes, kids[b], start, end, out);
    return;
  }
  if (e == b) {
    out->push_back({-1, start, end});
    return;
  }
  if (e - b == 1) {
    out->push_back({kids[b], start, end});
    return;
  }
  Node seq;
  seq.kind = Node::Kind::kSeq;
  seq.kids.assign(kids.begin() + static_cast<long>(b), kids.begin() + static_cast<long>(e));
  nodes.push_back(std::move(seq));
  out->push_back({static_cast<int>(nodes.size() - 1), start, end});
}

bool HasAnchor(const std::vector<Node>& nodes, int id) {
  const Node& n = nodes[id];
  if (n.kind == Node::Kind::kStart || n.kind == Node::Kind::kEnd) return true;
  for (int kid : n.kids) {
    if (HasAnchor(nodes, kid)) return true;
  }
  return false;
}

ExprId ToExpr(const std::vector<Node>& nodes, int id, CharEncoding enc, Grammar* g) {
  const Node& n = nodes[id];
  switch (n.kind) {
    case Node::Kind::kEmpty:
    case Node::Kind::kStart:
    case Node::Kind::kEnd:
      return g->Empty();
    case Node::Kind::kChars:
      return g->Chars(n.cps, enc);
    case Node::Kind::kSeq:
    case Node::Kind::kAlt: {
      std::vector<ExprId> kids;
      for (int kid : n.kids) kids.push_back(ToExpr(nodes, kid, enc, g));
      return n.kind == Node::Kind::kSeq ? g->Seq(std::move(kids)) : g->Alt(std::move(kids));
    }
    case Node::Kind::kRepeat:
      return g->Repeat(ToExpr(nodes, n.kids[0], enc, g), n.min, n.max);
  }
  return g->Empty();
}

StatusOr<std::vector<Branch>> ParseBranches(std::string_view pattern, std::vector<Node>* nodes) {
  Parser parser(pattern);
  DINFER_ASSIGN_OR_RETURN(int root, parser.Parse());
  *nodes = std::move(parser.nodes());
  std::vector<Branch> branches;
  Branches(*nodes, root, false, false, &branches);
  for (const Branch& b : branches) {
    if (b.body >= 0 && HasAnchor(*nodes, b.body)) {
      return Unimplemented("regex /{}/: an anchor (^ or $) inside the pattern is not supported",
                           pattern);
    }
  }
  return branches;
}

}  // namespace

StatusOr<ExprId> RegexToExpr(std::string_view pattern, const RegexOptions& options, Grammar* g) {
  std::vector<Node> nodes;
  DINFER_ASSIGN_OR_RETURN(std::vector<Branch> branches, ParseBranches(pattern, &nodes));
  const CharEncoding any_encoding = options.encoding == CharEncoding::kUtf8
                                        ? CharEncoding::kUtf8
                                        : CharEncoding::kJsonStringAnyEscape;
  std::vector<ExprId> alts;
  for (const Branch& b : branches) {
    const ExprId body = b.body < 0 ? g->Empty() : ToExpr(nodes, b.body, options.encoding, g);
    if (!options.search) {
      alts.push_back(body);
      continue;
    }
    std::vector<ExprId> parts;
    if (!b.start) parts.push_back(g->Star(g->Chars({{0, kMaxCodepoint}}, any_encoding)));
    parts.push_back(body);
    // What follows a match is free: once a match is complete, nothing else needs tracking.
    if (!b.end) parts.push_back(g->AbsorbingStar(g->Chars({{0, kMaxCodepoint}}, any_encoding)));
    alts.push_back(g->Seq(std::move(parts)));
  }
  return g->Alt(std::move(alts));
}

std::optional<ClassRepeat> AsClassRepeat(std::string_view pattern, bool search) {
  std::vector<Node> nodes;
  auto branches = ParseBranches(pattern, &nodes);
  if (!branches.ok() || branches->size() != 1) return std::nullopt;
  const Branch& b = (*branches)[0];
  if (search && !(b.start && b.end)) return std::nullopt;
  if (b.body < 0) return ClassRepeat{{}, 0, 0};
  const Node& n = nodes[b.body];
  if (n.kind == Node::Kind::kChars) return ClassRepeat{n.cps, 1, 1};
  if (n.kind == Node::Kind::kRepeat && nodes[n.kids[0]].kind == Node::Kind::kChars) {
    return ClassRepeat{nodes[n.kids[0]].cps, n.min, n.max};
  }
  return std::nullopt;
}

}  // namespace dinfer::structured
