// DeepSpeed's ds_config reader: hjson, as hjson-py 3.1.0 reads it (Note [DeepSpeed's hjson]).
#pragma once

#include <nlohmann/json.hpp>

#include <string_view>

namespace zc {

// The value of an hjson text as DeepSpeed's reader gives it: JSON, or hjson's forms (comments,
// quoteless keys and strings, '...' and '''multiline''' strings, commas left out or trailing, the
// root object's braces left out), numbers as hjson-py makes them (a whole number written with a
// fraction or exponent below 1e10 in magnitude is an integer), and no key twice in one object
// (DeepSpeed's object_pairs_hook). ConfigError naming the line and column and what was expected,
// in hjson-py's words, for text DeepSpeed's reader refuses.
nlohmann::json parse_hjson(std::string_view text);

}  // namespace zc
