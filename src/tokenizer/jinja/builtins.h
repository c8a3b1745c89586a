// The Jinja builtins the evaluator dispatches to: attribute and item access (Python's str, dict
// and list methods included, as the sandbox exposes them), slicing, filters, tests, and the
// global functions (range, dict, namespace). Every string result keeps the provenance of the text
// it was made from. Stateless functions; they throw TemplateError.
#pragma once

#include <string_view>

#include "tokenizer/jinja/value.h"

namespace dinfer::tokenizer::jinja {

// obj.name: a method of str/dict/list, a dict item, a namespace attribute; undefined otherwise.
Value GetAttr(const Value& obj, std::string_view name);
// obj[key]: an item (negative indices count from the end), or a method when key names one.
Value GetItem(const Value& obj, const Value& key);
// obj[start:stop:step] of a string or list (bounds are ints or None); other objects fail.
Value Slice(const Value& obj, const Value& start, const Value& stop, const Value& step);
// `item in container`.
bool Contains(const Value& container, const Value& item);

Value CallFilter(std::string_view name, const Value& input, const Args& args);
bool CallTest(std::string_view name, const Value& input, const Args& args);
bool HasFilter(std::string_view name);
bool HasTest(std::string_view name);

// range, dict, namespace.
Value GlobalFunction(std::string_view name);

// Argument binding for builtins: positional `index` or keyword `name`, else `fallback`.
const Value& Arg(const Args& args, size_t index, std::string_view name, const Value& fallback);
// Python's str.replace with provenance: `count` < 0 replaces all.
Text Replace(const Text& s, const Text& old, const Text& replacement, int64_t count);
// Python's `format % args` (%s, %r, %d, %i, %f, %%). With `mapping_arg` (a lone list or dict
// operand) leftover arguments are no error.
Text PercentFormat(const Text& format, const std::vector<Value>& args, bool mapping_arg);
// Python's str.split(sep, maxsplit); a null `sep` splits on runs of whitespace.
std::vector<Value> Split(const Text& s, const Text* sep, int64_t maxsplit, bool from_right);

}  // namespace dinfer::tokenizer::jinja
