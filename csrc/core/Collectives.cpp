// The lowering of every collective to Communicator calls. Checks run at the call; the steps
// run in the op's task on its stream (see Launcher.hpp and the contract in Device.hpp).

#include "core/Checks.hpp"
#include "core/Errors.hpp"
#include "core/Lowering.hpp"
#include "core/ProcessGroup.hpp"

#include <ATen/ATen.h>
#include <c10/util/irange.h>

#include <tuple>

namespace streamnccl {
namespace {

// The issue step of both reduce_scatter forms, once `whole` (every rank's block, on this rank)
// is made: its premultiplied copy and the output computed in stay in `scratch` (0 and 1)
// until the task ends, as NCCL reads them at the group's end.
void issueReduceScatter(Transport& comm, Kernels& kernels, c10::Stream stream,
                        const at::Tensor& whole, const at::Tensor& output,
                        const lowering::Reduction& reduction, lowering::Pair& scratch) {
  auto& [in, result] = scratch;
  in = lowering::premultiplied(kernels, whole, reduction);
  result = kernels.contiguous(output);
  comm.reduceScatter(*lowering::reductionBuffer(in), *lowering::reductionBuffer(result),
                     reduction.communicatorOp(), stream);
}

// Their finish step: the reduction finished (AVG, premul fallbacks) and copied to `output`.
void finishReduceScatter(Kernels& kernels, const at::Tensor& output,
                         const lowering::Reduction& reduction, const lowering::Pair& scratch,
                         int size) {
  const at::Tensor& result = scratch[1];
  lowering::finishReduction(kernels, *lowering::reductionBuffer(result), reduction, size);
  lowering::copyBack(kernels, output, result);
}

}  // namespace

c10::intrusive_ptr<c10d::Work> ProcessGroup::allreduce(std::vector<at::Tensor>& tensors,
                                                       const c10d::AllreduceOptions& opts) {
  constexpr const char* op = "allreduce";
  const at::Tensor& tensor = checks::singleTensor(op, "tensor", tensors);
  Path& path = pathFor(tensor.device(), op);
  Kernels callers(*path.device);
  const auto reduction =
      lowering::reduction(op, opts.reduceOp, tensor, *path.communicator, callers);
  const int size = getSize();
  // The result is computed in `work` (the tensor itself when possible) and copied back.
  return submit(
      {op, c10d::OpType::ALLREDUCE, tensor, reduction.withFactors(tensors), tensors, opts.asyncOp,
       opts.timeout},
      path,
      // The tensor, and what `work` computes in, in the scratch: held once for both steps.
      Steps::over(
          lowering::Pair{tensor, {}},
          [reduction](lowering::Pair& scratch, Transport& comm, Kernels& kernels,
                      c10::Stream stream) {
            auto& [tensor, work] = scratch;
            work = lowering::premultiplied(kernels, kernels.contiguous(tensor), reduction);
            const auto buffer = lowering::reductionBuffer(work);
            comm.allReduce(*buffer, *buffer, reduction.communicatorOp(), stream);
          },
          [reduction, size](lowering::Pair& scratch, Kernels& kernels) {
            const auto& [tensor, work] = scratch;
            lowering::finishReduction(kernels, *lowering::reductionBuffer(work), reduction, size);
            lowering::copyBack(kernels, tensor, work);
          }));
}

c10::intrusive_ptr<c10d::Work> ProcessGroup::allreduce_coalesced(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) {
  STREAMNCCL_CHECK_ARG(!tensors.empty(), "allreduce_coalesced", "`tensors` is empty");
  return coalesce([&] {
    for (auto& tensor : tensors) {
      std::vector<at::Tensor> one{tensor};
      allreduce(one, opts);
    }
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroup::broadcast(std::vector<at::Tensor>& tensors,
                                                       const c10d::BroadcastOptions& opts) {
  constexpr const char* op = "broadcast";
  const at::Tensor& tensor = checks::singleTensor(op, "tensor", tensors);
  checks::rootInRange(op, "src", opts.rootRank, getSize());
  STREAMNCCL_CHECK_ARG(opts.rootTensor == 0, op, "`rootTensor` is ", opts.rootTensor,
                       ", expected 0 (one tensor per process)");
  Path& path = pathFor(tensor.device(), op);
  const int root = static_cast<int>(opts.rootRank);
  return submit(
      {op, c10d::OpType::BROADCAST, tensor, tensors, tensors, opts.asyncOp, opts.timeout}, path,
      Steps::over<at::Tensor>(
          [tensor, root](at::Tensor& work, Transport& comm, Kernels& kernels, c10::Stream stream) {
            work = kernels.contiguous(tensor);
            const at::Tensor buffer = lowering::bytes(work);
            comm.broadcast(buffer, buffer, root, stream);
          },
          [tensor](at::Tensor& work, Kernels& kernels) {
            lowering::copyBack(kernels, tensor, work);
          }));
}

c10::intrusive_ptr<c10d::Work> ProcessGroup::reduce(std::vector<at::Tensor>& tensors,
                                                    const c10d::ReduceOptions& opts) {
  constexpr const char* op = "reduce";
  const at::Tensor& tensor = checks::singleTensor(op, "tensor", tensors);
  checks::rootInRange(op, "dst", opts.rootRank, getSize());
  STREAMNCCL_CHECK_ARG(opts.rootTensor == 0, op, "`rootTensor` is ", opts.rootTensor,
                       ", expected 0 (one tensor per process)");
  Path& path = pathFor(tensor.device(), op);
  Kernels callers(*path.device);
  const auto reduction =
      lowering::reduction(op, opts.reduceOp, tensor, *path.communicator, callers);
  const int root = static_cast<int>(opts.rootRank);
  const bool isRoot = root == getRank();
  const int size = getSize();
  return submit(
      {op, c10d::OpType::REDUCE, tensor, reduction.withFactors(tensors), tensors, opts.asyncOp,
       opts.timeout},
      path,
      Steps::over(
          lowering::Pair{tensor, {}},
          [reduction, root](lowering::Pair& scratch, Transport& comm, Kernels& kernels,
                            c10::Stream stream) {
            auto& [tensor, work] = scratch;
            work = lowering::premultiplied(kernels, kernels.contiguous(tensor), reduction);
            const auto buffer = lowering::reductionBuffer(work);
            comm.reduce(*buffer, *buffer, reduction.communicatorOp(), root, stream);
          },
          [reduction, size, isRoot](lowering::Pair& scratch, Kernels& kernels) {
            // Only the root's tensor receives the result; the others keep their input.
            if (isRoot) {
              const auto& [tensor, work] = scratch;
              lowering::finishReduction(kernels, *lowering::reductionBuffer(work), reduction, size);
              lowering::copyBack(kernels, tensor, work);
            }
          }));
}

c10::intrusive_ptr<c10d::Work> ProcessGroup::allgather(
    std::vector<std::vector<at::Tensor>>& outputTensors, std::vector<at::Tensor>& inputTensors,
    const c10d::AllgatherOptions& opts) {
  constexpr const char* op = "allgather";
  const at::Tensor& input = checks::singleTensor(op, "tensor", inputTensors);
  const std::vector<at::Tensor>& outputs =
      checks::rankList(op, "output_tensor_list", outputTensors, input, getSize());
  Path& path = pathFor(input.device(), op);
  const int size = getSize();
  return submit(
      {op, c10d::OpType::ALLGATHER, input, inputTensors, outputs, opts.asyncOp, opts.timeout}, path,
      // The scratch: the dense input, the gathered buffer.
      Steps::over<lowering::Pair>(
          [input, size](lowering::Pair& scratch, Transport& comm, Kernels& kernels,
                        c10::Stream stream) {
            auto& [dense, gathered] = scratch;
            dense = kernels.contiguous(input);
            // Allocated inside the task, so on CUDA the allocator ties it to the op's stream.
            gathered = at::empty({size * dense.numel()}, dense.options());
            comm.allGather(lowering::bytes(dense), lowering::bytes(gathered), stream);
          },
          [outputs, size](lowering::Pair& scratch, Kernels& kernels) {
            const at::Tensor& gathered = scratch[1];
            const int64_t count = gathered.numel() / size;
            for (const auto r : c10::irange(size)) {
              kernels.copy(outputs[r],
                           gathered.narrow(0, r * count, count).view(outputs[r].sizes()));
            }
          }));
}

c10::intrusive_ptr<c10d::Work> ProcessGroup::allgather_coalesced(
    std::vector<std::vector<at::Tensor>>& outputTensorLists, std::vector<at::Tensor>& inputTensors,
    const c10d::AllgatherOptions& opts) {
  checks::rankMajorLists("allgather_coalesced", "output_tensor_lists", outputTensorLists,
                         "input_tensor_list", inputTensors, getSize());
  // Input i is an allgather of its own, into the i-th tensor of every rank's output list.
  return coalesce([&] {
    for (const auto i : c10::irange(inputTensors.size())) {
      std::vector<std::vector<at::Tensor>> outputs(1);
      for (const auto& rankOutputs : outputTensorLists) {
        outputs[0].push_back(rankOutputs[i]);
      }
      std::vector<at::Tensor> input{inputTensors[i]};
      allgather(outputs, input, opts);
    }
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroup::_allgather_base(at::Tensor& outputTensor,
                                                             at::Tensor& inputTensor,
                                                             const c10d::AllgatherOptions& opts) {
  constexpr const char* op = "all_gather_into_tensor";
  checks::dense(op, "input_tensor", inputTensor);
  checks::wholeIsSizeParts(op, "output_tensor", outputTensor, "input_tensor", inputTensor,
                           getSize());
  Path& path = pathFor(inputTensor.device(), op);
  const at::Tensor input = inputTensor;
  const at::Tensor output = outputTensor;
  return submit(
      {op, c10d::OpType::_ALLGATHER_BASE, input, {input}, {output}, opts.asyncOp, opts.timeout},
      path,
      // The scratch: the dense input, the output computed in.
      Steps::over<lowering::Pair>(
          [input, output](lowering::Pair& scratch, Transport& comm, Kernels& kernels,
                          c10::Stream stream) {
            auto& [dense, result] = scratch;
            dense = kernels.contiguous(input);
            result = kernels.contiguous(output);
            comm.allGather(lowering::bytes(dense), lowering::bytes(result), stream);
          },
          [output](lowering::Pair& scratch, Kernels& kernels) {
            lowering::copyBack(kernels, output, scratch[1]);
          }));
}

c10::intrusive_ptr<c10d::Work> ProcessGroup::allgather_into_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  checks::pairedLists("allgather_into_tensor_coalesced", inputs, outputs);
  return coalesce([&] {
    for (const auto i : c10::irange(inputs.size())) {
      _allgather_base(outputs[i], inputs[i], opts);
    }
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroup::_reduce_scatter_base(
    at::Tensor& outputTensor, at::Tensor& inputTensor, const c10d::ReduceScatterOptions& opts) {
  constexpr const char* op = "reduce_scatter_tensor";
  checks::dense(op, "output", outputTensor);
  checks::wholeIsSizeParts(op, "input", inputTensor, "output", outputTensor, getSize());
  Path& path = pathFor(outputTensor.device(), op);
  Kernels callers(*path.device);
  const auto reduction =
      lowering::reduction(op, opts.reduceOp, outputTensor, *path.communicator, callers);
  const at::Tensor input = inputTensor;
  const at::Tensor output = outputTensor;
  const int size = getSize();
  return submit({op,
                 c10d::OpType::_REDUCE_SCATTER_BASE,
                 input,
                 reduction.withFactors({input}),
                 {output},
                 opts.asyncOp,
                 opts.timeout},
                path,
                // The scratch: the dense input, the output computed in.
                Steps::over<lowering::Pair>(
                    [input, output, reduction](lowering::Pair& scratch, Transport& comm,
                                               Kernels& kernels, c10::Stream stream) {
                      issueReduceScatter(comm, kernels, stream, kernels.contiguous(input), output,
                                         reduction, scratch);
                    },
                    [output, reduction, size](lowering::Pair& scratch, Kernels& kernels) {
                      finishReduceScatter(kernels, output, reduction, scratch, size);
                    }));
}

c10::intrusive_ptr<c10d::Work> ProcessGroup::reduce_scatter(
    std::vector<at::Tensor>& outputTensors, std::vector<std::vector<at::Tensor>>& inputTensors,
    const c10d::ReduceScatterOptions& opts) {
  constexpr const char* op = "reduce_scatter";
  const at::Tensor& output = checks::singleTensor(op, "output", outputTensors);
  const std::vector<at::Tensor>& inputs =
      checks::rankList(op, "input_list", inputTensors, output, getSize());
  Path& path = pathFor(output.device(), op);
  Kernels callers(*path.device);
  const auto reduction =
      lowering::reduction(op, opts.reduceOp, output, *path.communicator, callers);
  const int size = getSize();
  return submit({op, c10d::OpType::REDUCE_SCATTER, output, reduction.withFactors(inputs),
                 outputTensors, opts.asyncOp, opts.timeout},
                path,
                // The scratch: the concatenated input, the output computed in.
                Steps::over<lowering::Pair>(
                    [inputs, output, reduction](lowering::Pair& scratch, Transport& comm,
                                                Kernels& kernels, c10::Stream stream) {
                      std::vector<at::Tensor> dense;
                      dense.reserve(inputs.size());
                      for (const auto& input : inputs) {
                        dense.push_back(kernels.contiguous(input));
                      }
                      issueReduceScatter(comm, kernels, stream, kernels.concatenate(dense), output,
                                         reduction, scratch);
                    },
                    [output, reduction, size](lowering::Pair& scratch, Kernels& kernels) {
                      finishReduceScatter(kernels, output, reduction, scratch, size);
                    }));
}

c10::intrusive_ptr<c10d::Work> ProcessGroup::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  checks::pairedLists("reduce_scatter_tensor_coalesced", inputs, outputs);
  return coalesce([&] {
    for (const auto i : c10::irange(inputs.size())) {
      _reduce_scatter_base(outputs[i], inputs[i], opts);
    }
  });
}

}  // namespace streamnccl
