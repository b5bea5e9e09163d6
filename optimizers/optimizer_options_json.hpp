// Field tables of the optimizer options (optimizer_options.cc), for the run
// config's optimizer section; see lib/json_reader.hpp for the mechanism.
#pragma once

#include "tessera/optimizer_options.hpp"

namespace tessera {

template <class V>
void visitFields(V& v, SgdOptions& value);
template <class V>
void visitFields(V& v, AdamOptions& value);

}  // namespace tessera
