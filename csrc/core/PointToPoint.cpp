// send/recv, and the ops NCCL has no call for, lowered to one communicator group of sends and
// recvs: gather, scatter, alltoall (one call where the communicator has its own: Gloo's, and
// NCCL 2.28's for equal blocks).
// Data moves as bytes, so every dtype moves on every path.
// Temporaries made in `issue` are kept in the op's Scratch until the task ends (Lowering.hpp).

#include "core/Checks.hpp"
#include "core/Errors.hpp"
#include "core/Lowering.hpp"
#include "core/ProcessGroup.hpp"

#include <ATen/ATen.h>
#include <ATen/MemoryOverlap.h>
#include <c10/util/irange.h>

#include <algorithm>
#include <utility>

namespace streamnccl {
namespace {

// The steps of one receive into `tensor` (`receive` calls the communicator with the bytes it
// fills): into a dense copy where the tensor is not dense, and back after.
template <typename Receive>
Steps receiveInto(const at::Tensor& tensor, Receive receive) {
  return Steps::over<at::Tensor>(
      [tensor, receive](at::Tensor& scratch, Transport& comm, Kernels& kernels,
                        c10::Stream stream) {
        scratch = kernels.contiguous(tensor);
        receive(comm, lowering::bytes(scratch), stream);
      },
      [tensor](at::Tensor& scratch, Kernels& kernels) {
        lowering::copyBack(kernels, tensor, scratch);
      });
}

// Row offsets of consecutive blocks of `splits` rows.
std::vector<int64_t> offsetsOf(const std::vector<int64_t>& splits) {
  std::vector<int64_t> offsets(splits.size(), 0);
  for (size_t i = 1; i < splits.size(); ++i) {
    offsets[i] = offsets[i - 1] + splits[i - 1];
  }
  return offsets;
}

// For each output, whether it lies over any input's memory; each output is compared only with
// the inputs that share its storage.
std::vector<bool> outputsOverInputs(const std::vector<at::Tensor>& inputs,
                                    const std::vector<at::Tensor>& outputs) {
  std::vector<std::pair<const c10::StorageImpl*, const at::Tensor*>> byStorage;
  byStorage.reserve(inputs.size());
  for (const auto& in : inputs) {
    byStorage.emplace_back(in.storage().unsafeGetStorageImpl(), &in);
  }
  std::sort(byStorage.begin(), byStorage.end());
  std::vector<bool> over(outputs.size(), false);
  for (const auto r : c10::irange(outputs.size())) {
    const c10::StorageImpl* memory = outputs[r].storage().unsafeGetStorageImpl();
    auto sharing =
        std::lower_bound(byStorage.begin(), byStorage.end(),
                         std::make_pair(memory, static_cast<const at::Tensor*>(nullptr)));
    for (; sharing != byStorage.end() && sharing->first == memory && !over[r]; ++sharing) {
      over[r] = at::get_overlap_status(*sharing->second, outputs[r]) != at::MemOverlapStatus::No;
    }
  }
  return over;
}

int64_t bytesPerRow(const at::Tensor& tensor) {
  const int64_t rows = tensor.dim() == 0 ? 1 : tensor.size(0);
  return rows == 0 ? 0 : tensor.numel() / rows * tensor.element_size();
}

// gather's and scatter's issue step. The root exchanges `rootBlocks[r]` with every other
// rank r (receiving them for gather, sending them for scatter), each other rank `own` with the
// root the other way. The dense buffers are made first, in `scratch` (the root's by rank, the
// others' at the end), then the calls go in one communicator group.
void exchangeWithRoot(Transport& comm, Kernels& kernels, c10::Stream stream,
                      lowering::Many& scratch, const std::vector<at::Tensor>& rootBlocks,
                      const at::Tensor& own, int root, int rank, int size, bool rootReceives) {
  scratch.resize(size + 1);
  if (rank == root) {
    for (const auto r : c10::irange(size)) {
      if (r != root) {
        scratch[r] = kernels.contiguous(rootBlocks[r]);
      }
    }
  } else {
    scratch[size] = kernels.contiguous(own);
  }
  CommunicatorGroup group(comm);
  const auto exchange = [&](const at::Tensor& buffer, int peer, bool receive) {
    if (receive) {
      comm.recv(lowering::bytes(buffer), peer, stream);
    } else {
      comm.send(lowering::bytes(buffer), peer, stream);
    }
  };
  if (rank == root) {
    for (const auto r : c10::irange(size)) {
      if (r != root) {
        exchange(scratch[r], r, rootReceives);
      }
    }
  } else {
    exchange(scratch[size], root, !rootReceives);
  }
  group.end();
}

}  // namespace

c10::intrusive_ptr<c10d::Work> ProcessGroup::send(std::vector<at::Tensor>& tensors, int dstRank,
                                                  int /*tag: see HostCommunicator::send*/) {
  constexpr const char* op = "send";
  const at::Tensor& tensor = checks::singleTensor(op, "tensor", tensors);
  checks::peerInRange(op, "dst", dstRank, getSize());
  // Inside a group (batch_isend_irecv) the op joins the group's communicator group on the
  // group's stream; alone, it runs on its lane to the peer.
  Path& path = coalescing_ ? pathFor(tensor.device(), op)
                           : laneFor(tensor.device(), dstRank, Direction::Send, op);
  // Point-to-point ops carry no async flag in c10d: they run as async ops and dist.send waits.
  Launch launch{op, c10d::OpType::SEND, tensor, tensors, {}, /*async=*/true, c10d::kUnsetTimeout};
  launch.peer = dstRank;
  return submit(std::move(launch), path,
                Steps::over<at::Tensor>(
                    [tensor, dstRank](at::Tensor& scratch, Transport& comm, Kernels& kernels,
                                      c10::Stream stream) {
                      scratch = kernels.contiguous(tensor);
                      comm.send(lowering::bytes(scratch), dstRank, stream);
                    },
                    nullptr));
}

c10::intrusive_ptr<c10d::Work> ProcessGroup::recv(std::vector<at::Tensor>& tensors, int srcRank,
                                                  int /*tag*/) {
  constexpr const char* op = "recv";
  const at::Tensor& tensor = checks::singleTensor(op, "tensor", tensors);
  checks::peerInRange(op, "src", srcRank, getSize());
  Path& path = coalescing_ ? pathFor(tensor.device(), op)
                           : laneFor(tensor.device(), srcRank, Direction::Receive, op);
  Launch launch{op, c10d::OpType::RECV, tensor, {}, tensors, /*async=*/true, c10d::kUnsetTimeout};
  launch.peer = srcRank;
  return submit(
      std::move(launch), path,
      receiveInto(tensor, [srcRank](Transport& comm, const at::Tensor& bytes, c10::Stream stream) {
        comm.recv(bytes, srcRank, stream);
      }));
}

c10::intrusive_ptr<c10d::Work> ProcessGroup::recvAnysource(std::vector<at::Tensor>& tensors,
                                                           int /*tag*/) {
  constexpr const char* op = "recvAnySource";
  const at::Tensor& tensor = checks::singleTensor(op, "tensor", tensors);
  STREAMNCCL_CHECK_ARG(!coalescing_, op,
                       "a recv from any source cannot join a coalesced group; name the sender");
  Path& path = anySourceLaneFor(tensor.device(), op);
  auto sender = std::make_shared<std::atomic<int>>(-1);
  Launch launch{
      op, c10d::OpType::RECVANYSOURCE, tensor, {}, tensors, /*async=*/true, c10d::kUnsetTimeout};
  launch.sourceRank = sender;
  return submit(
      std::move(launch), path,
      receiveInto(tensor, [sender](Transport& comm, const at::Tensor& bytes, c10::Stream stream) {
        *sender = comm.recvFromAnySource(bytes, stream);
      }));
}

c10::intrusive_ptr<c10d::Work> ProcessGroup::gather(
    std::vector<std::vector<at::Tensor>>& outputTensors, std::vector<at::Tensor>& inputTensors,
    const c10d::GatherOptions& opts) {
  constexpr const char* op = "gather";
  const at::Tensor& input = checks::singleTensor(op, "tensor", inputTensors);
  checks::rootInRange(op, "dst", opts.rootRank, getSize());
  std::vector<at::Tensor> outputs;
  if (getRank() == opts.rootRank) {
    outputs = checks::rankList(op, "gather_list", outputTensors, input, getSize());
  } else {
    STREAMNCCL_CHECK_ARG(
        outputTensors.empty() || (outputTensors.size() == 1 && outputTensors[0].empty()), op,
        "`gather_list` must be empty on a rank other than dst (", opts.rootRank, "), got ",
        outputTensors.empty() ? 0 : outputTensors[0].size(), " tensors");
  }
  return gatherToRoot(op, input, inputTensors, outputs, outputs, opts);
}

#if STREAMNCCL_TORCH_AT_LEAST(2, 14)
c10::intrusive_ptr<c10d::Work> ProcessGroup::gather_single(at::Tensor& output, at::Tensor& input,
                                                           const c10d::GatherOptions& opts) {
  constexpr const char* op = "gather_single";
  checks::dense(op, "input", input);
  checks::rootInRange(op, "dst", opts.rootRank, getSize());
  std::vector<at::Tensor> ranksParts;
  std::vector<at::Tensor> whole;
  if (getRank() == opts.rootRank) {
    checks::sameDeviceAndDtype(op, "output", input, output);
    checks::wholeIsSizeParts(op, "output", output, "input", input, getSize());
    STREAMNCCL_CHECK_ARG(output.is_contiguous(), op, "`output` must be contiguous");
    for (const at::Tensor& part : output.view({getSize(), input.numel()}).unbind(0)) {
      ranksParts.push_back(part.view(input.sizes()));
    }
    whole.push_back(output);
  }
  std::vector<at::Tensor> inputs{input};
  return gatherToRoot(op, input, inputs, std::move(ranksParts), std::move(whole), opts);
}
#endif

c10::intrusive_ptr<c10d::Work> ProcessGroup::gatherToRoot(const char* op, const at::Tensor& input,
                                                          std::vector<at::Tensor>& inputs,
                                                          std::vector<at::Tensor> ranksParts,
                                                          std::vector<at::Tensor> outputs,
                                                          const c10d::GatherOptions& opts) {
  const int root = static_cast<int>(opts.rootRank);
  const int rank = getRank();
  const int size = getSize();
  Path& path = pathFor(input.device(), op);
  return submit(
      {op, c10d::OpType::GATHER, input, inputs, std::move(outputs), opts.asyncOp, opts.timeout},
      path,
      Steps::over<lowering::Many>(
          [input, ranksParts, root, rank, size](lowering::Many& scratch, Transport& comm,
                                                Kernels& kernels, c10::Stream stream) {
            exchangeWithRoot(comm, kernels, stream, scratch, ranksParts, input, root, rank, size,
                             /*rootReceives=*/true);
          },
          [input, ranksParts, root, rank, size](lowering::Many& scratch, Kernels& kernels) {
            if (rank != root) {
              return;
            }
            for (const auto r : c10::irange(size)) {
              if (r == root) {
                kernels.copy(ranksParts[r], input.view(ranksParts[r].sizes()));
              } else {
                lowering::copyBack(kernels, ranksParts[r], scratch[r]);
              }
            }
          }));
}

c10::intrusive_ptr<c10d::Work> ProcessGroup::scatter(
    std::vector<at::Tensor>& outputTensors, std::vector<std::vector<at::Tensor>>& inputTensors,
    const c10d::ScatterOptions& opts) {
  constexpr const char* op = "scatter";
  const at::Tensor& output = checks::singleTensor(op, "tensor", outputTensors);
  checks::rootInRange(op, "src", opts.rootRank, getSize());
  const int root = static_cast<int>(opts.rootRank);
  const int rank = getRank();
  const int size = getSize();
  std::vector<at::Tensor> inputs;
  if (rank == root) {
    inputs = checks::rankList(op, "scatter_list", inputTensors, output, size);
  } else {
    STREAMNCCL_CHECK_ARG(
        inputTensors.empty() || (inputTensors.size() == 1 && inputTensors[0].empty()), op,
        "`scatter_list` must be empty on a rank other than src (", root, "), got ",
        inputTensors.empty() ? 0 : inputTensors[0].size(), " tensors");
  }
  Path& path = pathFor(output.device(), op);
  return submit(
      {op, c10d::OpType::SCATTER, output, inputs, outputTensors, opts.asyncOp, opts.timeout}, path,
      Steps::over<lowering::Many>(
          [inputs, output, root, rank, size](lowering::Many& scratch, Transport& comm,
                                             Kernels& kernels, c10::Stream stream) {
            exchangeWithRoot(comm, kernels, stream, scratch, inputs, output, root, rank, size,
                             /*rootReceives=*/false);
          },
          [inputs, output, root, rank, size](lowering::Many& scratch, Kernels& kernels) {
            if (rank == root) {
              kernels.copy(output, inputs[root].view(output.sizes()));
            } else {
              lowering::copyBack(kernels, output, scratch[size]);
            }
          }));
}

c10::intrusive_ptr<c10d::Work> ProcessGroup::alltoall_base(at::Tensor& outputTensor,
                                                           at::Tensor& inputTensor,
                                                           std::vector<int64_t>& outputSplitSizes,
                                                           std::vector<int64_t>& inputSplitSizes,
                                                           const c10d::AllToAllOptions& opts) {
  constexpr const char* op = "all_to_all_single";
  const int rank = getRank();
  const int size = getSize();
  checks::dense(op, "input", inputTensor);
  checks::sameDeviceAndDtype(op, "output", inputTensor, outputTensor);
  const auto inSplits =
      checks::splitSizes(op, "input_split_sizes", inputSplitSizes, inputTensor, size);
  const auto outSplits =
      checks::splitSizes(op, "output_split_sizes", outputSplitSizes, outputTensor, size);
  const int64_t inRow = bytesPerRow(inputTensor);
  const int64_t outRow = bytesPerRow(outputTensor);
  STREAMNCCL_CHECK_ARG(inSplits[rank] * inRow == outSplits[rank] * outRow, op,
                       "this rank sends itself ", inSplits[rank] * inRow, " bytes (input rows ",
                       inSplits[rank], ") but expects ", outSplits[rank] * outRow, " (output rows ",
                       outSplits[rank], ")");
  Path& path = pathFor(inputTensor.device(), op);
  const at::Tensor input = inputTensor;
  const at::Tensor output = outputTensor;
  // The exchange reads the input while it writes the output: an output over the input's memory
  // (all_to_all_single(x, x)) is received into a buffer of its own, then copied back.
  const bool outputOverInput = at::get_overlap_status(input, output) != at::MemOverlapStatus::No;
  Launch launch{op,          c10d::OpType::ALLTOALL_BASE, input, {input}, {output}, opts.asyncOp,
                opts.timeout};
  launch.inputSplitSizes = inputSplitSizes;
  launch.outputSplitSizes = outputSplitSizes;
  // NCCL's all-to-all of equal blocks need not meet sends and recvs on the other ranks (its
  // copy-engine form does not), so it is taken when no splits were given, the same on every
  // rank (as torch's nccl backend does), not when this rank's splits happen to come out equal.
  const auto ownAllToAll = path.communicator->allToAllKind();
  const bool splitsGiven = !inputSplitSizes.empty() || !outputSplitSizes.empty();
  if (ownAllToAll == Communicator::AllToAll::AnyBlocks ||
      (ownAllToAll == Communicator::AllToAll::EqualBlocks && !splitsGiven)) {
    std::vector<int64_t> inBytes(size);
    std::vector<int64_t> outBytes(size);
    for (const auto r : c10::irange(size)) {
      inBytes[r] = inSplits[r] * inRow;
      outBytes[r] = outSplits[r] * outRow;
    }
    return submit(
        std::move(launch), path,
        Steps::over<lowering::Pair>(
            [=](lowering::Pair& scratch, Transport& comm, Kernels& kernels, c10::Stream stream) {
              scratch[0] = lowering::bytes(kernels.contiguous(input));
              scratch[1] = lowering::receiveBuffer(kernels, output, outputOverInput);
              comm.allToAll(scratch[0], lowering::bytes(scratch[1]), inBytes, outBytes, stream);
            },
            [=](lowering::Pair& scratch, Kernels& kernels) {
              lowering::copyBack(kernels, output, scratch[1]);
            }));
  }
  const auto inOffsets = offsetsOf(inSplits);
  const auto outOffsets = offsetsOf(outSplits);
  auto block = [](const at::Tensor& bytes, int64_t row, int64_t rows, int64_t rowBytes) {
    return bytes.narrow(0, row * rowBytes, rows * rowBytes);
  };
  return submit(
      std::move(launch), path,
      Steps::over<lowering::Pair>(
          [=](lowering::Pair& scratch, Transport& comm, Kernels& kernels, c10::Stream stream) {
            scratch[0] = lowering::bytes(kernels.contiguous(input));
            scratch[1] = lowering::receiveBuffer(kernels, output, outputOverInput);
            const at::Tensor outBytes = lowering::bytes(scratch[1]);
            CommunicatorGroup group(comm);
            for (const auto r : c10::irange(size)) {
              if (r == rank) {
                continue;  // copied in finish
              }
              // Zero-row blocks are skipped on both sides: the peer's splits say the same.
              if (inSplits[r] > 0) {
                comm.send(block(scratch[0], inOffsets[r], inSplits[r], inRow), r, stream);
              }
              if (outSplits[r] > 0) {
                comm.recv(block(outBytes, outOffsets[r], outSplits[r], outRow), r, stream);
              }
            }
            group.end();
          },
          [=](lowering::Pair& scratch, Kernels& kernels) {
            const at::Tensor outBytes = lowering::kernelBytes(scratch[1]);
            kernels.copy(block(outBytes, outOffsets[rank], outSplits[rank], outRow),
                         block(scratch[0], inOffsets[rank], inSplits[rank], inRow));
            lowering::copyBack(kernels, output, scratch[1]);
          }));
}

c10::intrusive_ptr<c10d::Work> ProcessGroup::alltoall(std::vector<at::Tensor>& outputTensors,
                                                      std::vector<at::Tensor>& inputTensors,
                                                      const c10d::AllToAllOptions& opts) {
  constexpr const char* op = "all_to_all";
  const int rank = getRank();
  const int size = getSize();
  STREAMNCCL_CHECK_ARG(!inputTensors.empty(), op,
                       "`input_tensor_list` is empty, expected one "
                       "tensor per rank: ",
                       size);
  checks::dense(op, "input_tensor_list[0]", inputTensors[0]);
  checks::perRankTensors(op, "input_tensor_list", inputTensors, inputTensors[0], size);
  checks::perRankTensors(op, "output_tensor_list", outputTensors, inputTensors[0], size);
  STREAMNCCL_CHECK_ARG(inputTensors[rank].numel() == outputTensors[rank].numel(), op,
                       "`output_tensor_list[", rank, "]` has ", outputTensors[rank].numel(),
                       " elements but this rank sends itself `input_tensor_list[", rank, "]` of ",
                       inputTensors[rank].numel());
  Path& path = pathFor(inputTensors[0].device(), op);
  const std::vector<at::Tensor> inputs = inputTensors;
  const std::vector<at::Tensor> outputs = outputTensors;
  // The group's sends read the inputs while its recvs write the outputs: an output over any
  // input's memory (all_to_all(xs, xs)) is received into a buffer of its own, and copied back
  // once this rank's own block has been read.
  STREAMNCCL_CHECK_ARG(
      at::get_overlap_status(outputs[rank], inputs[rank]) != at::MemOverlapStatus::Partial, op,
      "`output_tensor_list[", rank, "]` partly overlaps `input_tensor_list[", rank,
      "]`: this rank's own block is copied, and a copy cannot read and write memory that only "
      "partly coincides (the same tensor, or tensors apart, are fine)");
  const std::vector<bool> receivedApart = outputsOverInputs(inputs, outputs);
  return submit(
      {op, c10d::OpType::ALLTOALL, inputs[0], inputs, outputs, opts.asyncOp, opts.timeout}, path,
      Steps::over<lowering::Many>(
          [=](lowering::Many& scratch, Transport& comm, Kernels& kernels, c10::Stream stream) {
            scratch.resize(2 * size);
            for (const auto r : c10::irange(size)) {
              if (r != rank && inputs[r].numel() > 0) {
                scratch[r] = kernels.contiguous(inputs[r]);
              }
              if (r != rank && outputs[r].numel() > 0) {
                scratch[size + r] = lowering::receiveBuffer(kernels, outputs[r], receivedApart[r]);
              }
            }
            CommunicatorGroup group(comm);
            for (const auto r : c10::irange(size)) {
              if (scratch[r].defined()) {
                comm.send(lowering::bytes(scratch[r]), r, stream);
              }
              if (scratch[size + r].defined()) {
                comm.recv(lowering::bytes(scratch[size + r]), r, stream);
              }
            }
            group.end();
          },
          [=](lowering::Many& scratch, Kernels& kernels) {
            kernels.copy(outputs[rank],
                         kernels.contiguous(inputs[rank]).view(outputs[rank].sizes()));
            for (const auto r : c10::irange(size)) {
              if (r != rank && scratch[size + r].defined()) {
                lowering::copyBack(kernels, outputs[r], scratch[size + r]);
              }
            }
          }));
}

}  // namespace streamnccl
