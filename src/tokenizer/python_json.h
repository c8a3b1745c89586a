// PythonJson: JSON text as Python's json.dumps(value, ensure_ascii=False) writes it (", " and
// ": " separators, non-ASCII kept, members in their order), which is how DeepSeek's encodings put
// tool schemas and arguments into prompts; the model saw this spelling in training. Floats are
// spelled as DeepSeek's reference encoder spells them: shortest round-trip digits, fixed notation
// for decimal exponents -5..15 (with ".0" when integral), otherwise "1.5e+300" / "1e-7".
// A pure function; safe from any thread.
#pragma once

#include <string>
#include <string_view>

#include <boost/json/value.hpp>

namespace dinfer::tokenizer {

std::string PythonJson(const boost::json::value& value);
void AppendPythonJson(const boost::json::value& value, std::string* out);

}  // namespace dinfer::tokenizer
