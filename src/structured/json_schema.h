// JSON Schema to grammar. Supports drafts 4, 6, 7, 2019-09 and 2020-12 as found in the wild:
// type, properties (generated in schema order), required, additionalProperties,
// patternProperties (one pattern, or several with the same schema, without additional
// properties), propertyNames (when no other keys are possible), min/maxProperties, items,
// prefixItems, additionalItems, min/maxItems, enum, const, anyOf, oneOf (when its alternatives
// provably exclude each other), allOf (merged), $ref to $defs / definitions / $id / $anchor inside
// the document (recursion included), pattern, min/maxLength, minimum / maximum /
// exclusiveMinimum / exclusiveMaximum, multipleOf 10^-d, and the formats date, time, date-time,
// duration, email, hostname, ipv4, ipv6, uuid, uri and uri-reference. Unknown keywords and
// unknown formats are annotations (ignored, as the specification says); known validation keywords
// that cannot be enforced (not, if/then/else, dependencies, uniqueItems, contains, remote refs,
// ...) are refused with an error naming the keyword and where it is.
//
// What the grammar generates is a subset of the valid instances: properties appear in the order
// the schema lists them (additional properties after them), numbers with bounds have no exponent,
// integers are written without a fraction, enum and const values are written compactly, and
// whitespace is limited by JsonSchemaOptions. Plain functions; thread-safe.
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
