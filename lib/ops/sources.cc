// Sources: Input (a host stream), Variable (persistent state), Constant.
// They have no inputs; Graph::addSource adds them, so they have no shape
// rule, and no gradient to pass on.
#include <fmt/format.h>

#include "op_def.hpp"

namespace tessera {

void addSourceOps(OpTable& table) {
  table.add({.kind = OpKind::Input,
             .family = OpFamily::Source,
             .work = OpWork::None,
             .reference = [](ReferenceOp& r, int64_t replica) {
               const std::vector<double>& fed = r.feed(replica);
               if (fed.size() != r.out(replica).size()) {
                 r.fail(fmt::format("input \"{}\" was not fed on replica {}",
                                    r.graph().tensor(r.op().outputs[0]).name, replica));
               }
               r.out(replica) = fed;
             }});
  // A variable's state lives in its storage: no reference step either.
  table.add({.kind = OpKind::Variable, .family = OpFamily::Source, .work = OpWork::None});
  table.add({.kind = OpKind::Constant,
             .family = OpFamily::Source,
             .work = OpWork::None,
             .reference = [](ReferenceOp& r, int64_t replica) {
               const TensorNode& node = r.graph().tensor(r.op().outputs[0]);
               if (node.dtype == DType::Float64) {
                 r.out(replica) = unpackDoubles(node.data);
                 return;
               }
               r.out(replica).assign(node.data.begin(), node.data.end());
             }});
}

}  // namespace tessera
