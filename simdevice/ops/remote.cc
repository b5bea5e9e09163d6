// The remote family's kernels (lib/ops/remote.cc defines the ops): the
// transfers of collectives.hpp between the arena and the streaming-memory
// entries.
#include "collectives.hpp"
#include "kernel_table.hpp"

namespace tessera::sim {

void addRemoteKernels(KernelTable& table) {
  table.add({.kind = OpKind::RemoteLoad, .plan = [](StepPlanner& planner, Step& step) {
               const OpNode& op = planner.op();
               const RemoteBufferInfo& info = planner.graph().remoteBuffer(op.attributes.remoteBuffer);
               step.in[0] = planner.remoteEntry(op.attributes.remoteBuffer, 0);
               planRemoteLoad(step, planner.layout(op.outputs[0]),
                              planner.bufferLayout(op.attributes.remoteBuffer), op.attributes.entry,
                              numElements(info.shape), planner.localReplicas());
               planner.emit(std::move(step));
             }});
  table.add({.kind = OpKind::RemoteStore, .plan = [](StepPlanner& planner, Step& step) {
               const OpNode& op = planner.op();
               const RemoteBufferInfo& info = planner.graph().remoteBuffer(op.attributes.remoteBuffer);
               step.out = planner.remoteEntry(op.attributes.remoteBuffer, 0);
               step.in[0] = planner.buffer(op.inputs[0]);
               planRemoteStore(step, planner.layout(op.inputs[0]),
                               planner.bufferLayout(op.attributes.remoteBuffer), op.attributes.entry,
                               numElements(info.shape), planner.localReplicas());
               planner.emit(std::move(step));
             }});
}

}  // namespace tessera::sim
