// EBNF grammars to Grammar, in the two common notations:
//  - GBNF (llama.cpp): `name ::= alt | alt`, "strings" with \n \t \r \\ \" \xHH \uHHHH \UHHHHHHHH
//    escapes, [character classes] and [^negated] ones, `.` for any character, ( groups ),
//    postfix * + ? {m} {m,} {m,n} {,n}, and # comments;
//  - W3C XML-spec EBNF: `name ::= ...` with 'single-quoted' strings, #xN characters,
//    [#xN-#xM] classes, A - B between character sets, and /* comments */.
// The root is the rule named `root`, else the first rule. Rules may recurse, but not on the left
// (the automaton reports that). Characters are Unicode code points matched as UTF-8. Plain
// functions.
#pragma once

#include <string_view>

#include "base/status.h"
#include "structured/grammar.h"

namespace dinfer::structured {

StatusOr<Grammar> EbnfToGrammar(std::string_view text);

// A grammar matching exactly one of the given strings.
Grammar ChoiceGrammar(const std::vector<std::string>& choices);

}  // namespace dinfer::structured
