// Field tables of the optimizer options and of the run config's optimizer
// section (optimizer_options.cc); see lib/json_reader.hpp for the mechanism.
#pragma once

#include "tessera/optimizers/optimizer_options.hpp"

namespace tessera {

namespace jsonio {
class JsonReader;
class JsonWriter;
class SchemaBuilder;
class LeafLister;
class RuleChecker;
}  // namespace jsonio

template <class V>
void visitFields(V& v, SgdOptions& value);
template <class V>
void visitFields(V& v, AdamOptions& value);

// The optimizer section has a table per visitor: it is flat ("type" and the
// fields of that type's options), the reader explains the keys of the other
// types and the schema has one alternative per type.
void visitFields(jsonio::JsonReader& v, OptimizerConfig& value);
void visitFields(jsonio::JsonWriter& v, OptimizerConfig& value);
void visitFields(jsonio::SchemaBuilder& v, OptimizerConfig& value);
void visitFields(jsonio::LeafLister& v, OptimizerConfig& value);
void visitFields(jsonio::RuleChecker& v, OptimizerConfig& value);

}  // namespace tessera
