#include <algorithm>
#include <set>

#include "structured/json_schema_internal.h"

namespace dinfer::structured::json_internal {
namespace {

json::array TypeNames(uint32_t bits) {
  json::array out;
  if (bits & kNull) out.emplace_back("null");
  if (bits & kBoolean) out.emplace_back("boolean");
  if (bits & kObject) out.emplace_back("object");
  if (bits & kArray) out.emplace_back("array");
  if (bits & kString) out.emplace_back("string");
  if (bits & kNumber) {
    out.emplace_back("number");
  } else if (bits & kInteger) {
    out.emplace_back("integer");
  }
  return out;
}

json::value AllOf(const json::value& a, const json::value& b) {
  if (a.is_bool() && a.get_bool()) return b;
  if (b.is_bool() && b.get_bool()) return a;
  if ((a.is_bool() && !a.get_bool()) || (b.is_bool() && !b.get_bool())) return false;
  if (SerializeCompact(a) == SerializeCompact(b)) return a;
  return json::object{{"allOf", json::array{a, b}}};
}

// The tighter of two bounds: lower bounds take the larger, upper bounds the smaller.
void Tighten(json::object* r, const json::object& b, std::string_view key, bool lower) {
  const json::value* vb = b.if_contains(key);
  if (!vb) return;
  const json::value* va = r->if_contains(key);
  auto da = va ? ToDecimal(*va) : std::nullopt;
  auto db = ToDecimal(*vb);
  if (!db) return;
  if (!da || (lower ? Decimal::Compare(*db, *da) > 0 : Decimal::Compare(*db, *da) < 0)) {
    (*r)[key] = *vb;
  }
}

}  // namespace

StatusOr<json::object> MergeSchemas(const json::object& a, const json::object& b) {
  json::object r = a;
  auto unsupported = [](std::string_view what) {
    return Unimplemented("allOf combining {} is not supported", what);
  };
  // Types.
  if (b.contains("type")) {
    DINFER_ASSIGN_OR_RETURN(uint32_t ta, DeclaredTypes(a));
    DINFER_ASSIGN_OR_RETURN(uint32_t tb, DeclaredTypes(b));
    r["type"] = TypeNames(ta & tb);
  }
  // Literal sets.
  if (const json::value* eb = b.if_contains("enum")) {
    if (const json::value* ea = r.if_contains("enum"); ea && ea->is_array() && eb->is_array()) {
      std::set<std::string> in_b;
      for (const auto& v : eb->as_array()) in_b.insert(SerializeCompact(v));
      json::array both;
      for (const auto& v : ea->as_array()) {
        if (in_b.contains(SerializeCompact(v))) both.push_back(v);
      }
      r["enum"] = std::move(both);
    } else {
      r["enum"] = *eb;
    }
  }
  if (const json::value* cb = b.if_contains("const")) {
    if (const json::value* ca = r.if_contains("const")) {
      if (SerializeCompact(*ca) != SerializeCompact(*cb)) r["enum"] = json::array{};
    } else {
      r["const"] = *cb;
    }
  }
  // Bounds.
  for (const char* k : {"minimum", "exclusiveMinimum", "minLength", "minItems", "minProperties"}) {
    Tighten(&r, b, k, true);
  }
  for (const char* k : {"maximum", "exclusiveMaximum", "maxLength", "maxItems", "maxProperties"}) {
    Tighten(&r, b, k, false);
  }
  for (const char* k : {"pattern", "multipleOf", "patternProperties", "prefixItems", "contains",
                        "not", "if", "oneOf", "propertyNames"}) {
    const json::value* vb = b.if_contains(k);
    if (!vb) continue;
    const json::value* va = r.if_contains(k);
    if (va && SerializeCompact(*va) != SerializeCompact(*vb)) return unsupported(k);
    r[k] = *vb;
  }
  if (const json::value* fb = b.if_contains("format"); fb && !r.contains("format")) {
    r["format"] = *fb;
  }
  if (const json::value* ub = b.if_contains("uniqueItems"); ub && ub->is_bool() && ub->get_bool()) {
    r["uniqueItems"] = true;
  }
  // Items.
  const json::value* ia = r.if_contains("items");
  const json::value* ib = b.if_contains("items");
  if (ib) {
    if (ia && (ia->is_array() || ib->is_array())) return unsupported("two tuple 'items'");
    r["items"] = ia ? AllOf(*ia, *ib) : *ib;
  }
  if (const json::value* xb = b.if_contains("additionalItems")) {
    const json::value* xa = r.if_contains("additionalItems");
    r["additionalItems"] = xa ? AllOf(*xa, *xb) : *xb;
  }
  // Objects: each side's additionalProperties applies to the other side's extra properties.
  const json::value* pa = a.if_contains("properties");
  const json::value* pb = b.if_contains("properties");
  const json::value* apa = a.if_contains("additionalProperties");
  const json::value* apb = b.if_contains("additionalProperties");
  if ((apa && a.contains("patternProperties") && pb) ||
      (apb && b.contains("patternProperties") && pa)) {
    return unsupported("additionalProperties and patternProperties with other properties");
  }
  if (pa || pb) {
    json::object props;
    const json::object empty;
    const json::object& oa = pa && pa->is_object() ? pa->as_object() : empty;
    const json::object& ob = pb && pb->is_object() ? pb->as_object() : empty;
    for (const auto& kv : oa) {
      json::value v = kv.value();
      if (const json::value* other = ob.if_contains(kv.key())) {
        v = AllOf(v, *other);
      } else if (apb) {
        v = AllOf(v, *apb);
      }
      props[kv.key()] = std::move(v);
    }
    for (const auto& kv : ob) {
      if (oa.contains(kv.key())) continue;
      props[kv.key()] = apa ? AllOf(kv.value(), *apa) : kv.value();
    }
    r["properties"] = std::move(props);
  }
  if (apb) r["additionalProperties"] = apa ? AllOf(*apa, *apb) : *apb;
  if (const json::value* rb = b.if_contains("required"); rb && rb->is_array()) {
    json::array req;
    std::set<std::string> seen;
    const json::value* ra = r.if_contains("required");
    for (const json::value* list : {ra, rb}) {
      if (!list || !list->is_array()) continue;
      for (const auto& x : list->as_array()) {
        if (x.is_string() && seen.insert(std::string(x.as_string())).second) req.push_back(x);
      }
    }
    r["required"] = std::move(req);
  }
  // anyOf on both sides: every pair.
  if (const json::value* yb = b.if_contains("anyOf"); yb && yb->is_array()) {
    if (const json::value* ya = r.if_contains("anyOf"); ya && ya->is_array()) {
      if (ya->as_array().size() * yb->as_array().size() > 64)
        return unsupported("large anyOf lists");
      json::array prod;
      for (const auto& x : ya->as_array()) {
        for (const auto& y : yb->as_array()) prod.push_back(AllOf(x, y));
      }
      r["anyOf"] = std::move(prod);
    } else {
      r["anyOf"] = *yb;
    }
  }
  // Everything else (annotations, dependencies, ...) is taken from b when a lacks it, so that
  // unsupported keywords still get reported.
  for (const auto& kv : b) {
    if (!r.contains(kv.key())) r[kv.key()] = kv.value();
  }
  return r;
}

namespace {

// The literal values a schema allows, when it lists them (enum / const).
std::optional<std::set<std::string>> Literals(const json::object& s) {
  std::optional<std::set<std::string>> out;
  if (const json::value* e = s.if_contains("enum"); e && e->is_array()) {
    out.emplace();
    for (const auto& v : e->as_array()) out->insert(SerializeCompact(v));
  }
  if (const json::value* c = s.if_contains("const")) {
    const std::string text = SerializeCompact(*c);
    if (out && !out->contains(text)) return std::set<std::string>{};
    out = std::set<std::string>{text};
  }
  return out;
}

uint32_t Types(const json::object& s) {
  auto declared = DeclaredTypes(s);
  uint32_t t = declared.ok() ? *declared : kAllTypes;
  if (const json::value* e = s.if_contains("enum"); e && e->is_array()) {
    uint32_t lt = 0;
    for (const auto& v : e->as_array()) lt |= TypeOfValue(v);
    t &= lt | ((lt & kInteger) ? static_cast<uint32_t>(kNumber) : 0u);
  }
  if (const json::value* c = s.if_contains("const")) {
    const uint32_t ct = TypeOfValue(*c);
    t &= ct | ((ct & kInteger) ? static_cast<uint32_t>(kNumber) : 0u);
  }
  return t;
}

const json::object* Props(const json::object& s) {
  const json::value* p = s.if_contains("properties");
  return p && p->is_object() ? &p->as_object() : nullptr;
}

bool Requires(const json::object& s, std::string_view name) {
  const json::value* r = s.if_contains("required");
  if (!r || !r->is_array()) return false;
  for (const auto& x : r->as_array()) {
    if (x.is_string() && x.as_string() == name) return true;
  }
  return false;
}

bool ClosedWithout(const json::object& s, std::string_view name) {
  const json::value* ap = s.if_contains("additionalProperties");
  const bool closed = ap && ap->is_bool() && !ap->get_bool() && !s.contains("patternProperties");
  const json::object* p = Props(s);
  return closed && !(p && p->contains(name));
}

std::optional<std::pair<Decimal, Decimal>> Range(const json::object& s) {
  auto bound = [&](const char* k) {
    const json::value* v = s.if_contains(k);
    return v ? ToDecimal(*v) : std::nullopt;
  };
  auto lo = bound("minimum"), xlo = bound("exclusiveMinimum");
  auto hi = bound("maximum"), xhi = bound("exclusiveMaximum");
  if (xlo && (!lo || Decimal::Compare(*xlo, *lo) > 0)) lo = xlo;
  if (xhi && (!hi || Decimal::Compare(*xhi, *hi) < 0)) hi = xhi;
  if (!lo && !hi) return std::nullopt;
  Decimal very_low, very_high;
  very_low.negative = true;
  very_low.int_digits = very_high.int_digits = std::string(400, '9');
  return std::make_pair(lo ? *lo : very_low, hi ? *hi : very_high);
}

}  // namespace

bool Disjoint(const json::object& a, const json::object& b, const Flattener& flatten) {
  const uint32_t ta = Types(a), tb = Types(b);
  // Integers are numbers too.
  const uint32_t na = ta & kNumber ? ta | kInteger : ta;
  const uint32_t nb = tb & kNumber ? tb | kInteger : tb;
  const uint32_t common = na & nb;
  if (common == 0) return true;
  const auto la = Literals(a), lb = Literals(b);
  if (la && lb) {
    return std::none_of(la->begin(), la->end(),
                        [&](const std::string& x) { return lb->contains(x); });
  }
  if ((common & ~(kInteger | kNumber)) == 0) {
    // Numbers only: ranges that do not meet (bounds taken as inclusive).
    const auto ra = Range(a), rb = Range(b);
    return ra && rb &&
           (Decimal::Compare(ra->second, rb->first) < 0 ||
            Decimal::Compare(rb->second, ra->first) < 0);
  }
  if (common != kObject) return false;
  // Objects: a discriminating property both require with values that exclude each other, or a
  // required property that the other side forbids.
  const json::object* pa = Props(a);
  const json::object* pb = Props(b);
  if (pa && pb) {
    for (const auto& kv : *pa) {
      const json::value* vb = pb->if_contains(kv.key());
      if (!vb || !Requires(a, kv.key()) || !Requires(b, kv.key())) continue;
      const auto fa = flatten(kv.value()), fb = flatten(*vb);
      if (fa && fb && Disjoint(*fa, *fb, flatten)) return true;
    }
  }
  for (const auto* side : {&a, &b}) {
    const json::object& other = side == &a ? b : a;
    const json::value* req = side->if_contains("required");
    if (!req || !req->is_array()) continue;
    for (const auto& x : req->as_array()) {
      if (x.is_string() && ClosedWithout(other, x.as_string())) return true;
    }
  }
  return false;
}

}  // namespace dinfer::structured::json_internal
