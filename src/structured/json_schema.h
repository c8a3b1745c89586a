// JSON Schema to grammar. Supports drafts 4, 6, 7, 2019-09 and 2020-12 as found in the wild:
// type, properties (generated in schema order), required, additionalProperties,
// patternProperties (patterns with different schemas must not share keys), propertyNames (when
// no other keys are possible), min/maxProperties, items, prefixItems, additionalItems,
// min/maxItems, enum, const, anyOf, oneOf (when its alternatives provably exclude each other, or
// are objects told apart by the properties they require: each is then generated without the
// properties only the others require), allOf (merged), $ref to $defs / definitions / $id /
// $anchor inside the document (recursion included), pattern, min/maxLength, minimum / maximum /
// exclusiveMinimum / exclusiveMaximum, multipleOf 10^-d, and the formats date, time, date-time,
// duration, email, hostname, ipv4, ipv6, uuid, uri, uri-reference and json-pointer. Unknown
// keywords and unknown formats are annotations (ignored, as the specification says); known
// validation keywords that cannot be enforced (not, if/then/else, dependencies, uniqueItems,
// contains, remote refs, ...) are refused with an error naming the keyword and where it is.
//
// What the grammar generates is a subset of the valid instances: properties appear in the order
// the schema lists them (those added by allOf / anyOf / oneOf / $ref after the ones listed beside
// them, other properties last), numbers with bounds have no exponent, integers are written
// without a fraction, enum and const values are written compactly, and whitespace is limited by
// JsonSchemaOptions. Keys of additional properties never repeat a listed name but may repeat each
// other. Plain functions; thread-safe.
#pragma once

#include <cstdint>
#include <string_view>

#include <boost/json/value.hpp>

#include "base/status.h"
#include "structured/grammar.h"

namespace dinfer::structured {

struct JsonSchemaOptions {
  // Whitespace allowed where JSON allows it (around , : [ ] { }), in runs of at most this many
  // bytes of [ \t\n\r]; 0 for compact JSON only, -1 for unbounded runs. Not before or after the
  // top-level value.
  int32_t max_whitespace = 16;
  // The draft (4, 6, 7, 2019 or 2020) of schemas without "$schema". It decides whether keywords
  // next to "$ref" apply (2019 and later) or are ignored.
  int32_t default_draft = 2020;
};

StatusOr<Grammar> JsonSchemaToGrammar(const boost::json::value& schema,
                                      const JsonSchemaOptions& options = {});
// Parses the schema text first (InvalidArgument when it is not JSON).
StatusOr<Grammar> JsonSchemaToGrammar(std::string_view schema_json,
                                      const JsonSchemaOptions& options = {});
// Any JSON object (OpenAI's response_format json_object).
Grammar JsonObjectGrammar(const JsonSchemaOptions& options = {});

}  // namespace dinfer::structured
