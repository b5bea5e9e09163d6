// Rebuilding a graph. The Graph has no op removal or input replacement, so a
// transform that changes how tensors are held (the location transforms)
// copies the graph op by op into a new one, substituting as it goes.
//
// Ops are copied in creation order, which is a valid data order and keeps
// the automatic program order of in-place and remote ops (graph.hpp) as the
// original had it; copyOrder() then re-creates every explicit `after`
// constraint between the copies.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "tessera/lib/graph.hpp"

namespace tessera::detail {

class GraphCopy {
 public:
  // The output graph starts with the same replication factor and remote
  // buffers (same ids) as `in`.
  explicit GraphCopy(const Graph& in);

  const Graph& in() const noexcept { return in_; }
  Graph& out() noexcept { return out_; }

  // The copy of an input tensor; kNoTensor until it is copied.
  TensorId mapped(TensorId original) const { return tensorMap_.at(static_cast<std::size_t>(original)); }
  void setMapped(TensorId original, TensorId copy) { tensorMap_.at(static_cast<std::size_t>(original)) = copy; }

  // Adds `node` (a modified copy of op `id`'s output) as a source of the same
  // kind; it becomes the mapping of the original output.
  TensorId copySource(OpId id, TensorNode node);
  // Adds op `id` with `inputs` (tensors of the output graph), its kind,
  // attributes and name. Its outputs take the originals' names, categories
  // and tile sets, and become their mappings.
  OpId copyOp(OpId id, std::vector<TensorId> inputs);
  // Records `copy` as the op that stands for input op `original` in program
  // order constraints (copyOp and copySource do so themselves).
  void setOpCopy(OpId original, OpId copy) { opMap_.at(static_cast<std::size_t>(original)) = copy; }

  // A name used by neither graph: `base`, else "base.1", "base.2", ...
  std::string freshName(std::string_view base);

  // Re-creates the `after` constraints of the input graph between copies.
  void copyOrder();

  Graph take() { return std::move(out_); }

 private:
  const Graph& in_;
  Graph out_;
  std::vector<TensorId> tensorMap_;
  std::vector<OpId> opMap_;
};

}  // namespace tessera::detail
