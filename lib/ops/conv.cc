// The convolution family over NC[D]HW tensors with 1 to 3 spatial axes.
//
// Conv: (x [N, C, D..], w [M, C/group, K..]) -> y [N, M, O..], each output
// channel of group g reading the input channels of group g. ConvTranspose
// is Conv's transpose (its gradient with respect to its input), and
// ConvGradWeight the gradient with respect to its weight. All three are one
// convolution seen three ways; in its terms ("conv input" [N, Ci, I..],
// "conv output" [N, Co, P..], weight [Co, Ci/group, K..]):
//   Conv            conv input, weight      -> conv output
//   ConvTranspose   conv output, weight     -> conv input
//   ConvGradWeight  conv output, conv input -> weight
// so each one's gradients are the other two.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "op_def.hpp"
#include "window.hpp"

namespace tessera {
namespace {

using Values = std::vector<double>;

// One convolution in the terms above, with the tap table of its windows.
struct ConvDims {
  int64_t batch = 0;
  int64_t cIn = 0;   // channels of the conv input
  int64_t cOut = 0;  // channels of the conv output
  int64_t group = 1;
  WindowGeometry window;  // over the conv input's spatial axes
  std::vector<int64_t> taps;

  int64_t cInGroup() const { return cIn / group; }
  int64_t cOutGroup() const { return cOut / group; }
  // Multiply-adds of the convolution.
  double macs() const {
    return static_cast<double>(batch) * static_cast<double>(cOut) * static_cast<double>(cInGroup()) *
           static_cast<double>(window.taps()) * static_cast<double>(window.outPositions());
  }
};

ConvDims convDims(const Shape& convIn, const Shape& convOut, const Shape& weight, const OpAttributes& a) {
  ConvDims d;
  d.batch = convIn[0];
  d.cIn = convIn[1];
  d.cOut = convOut[1];
  d.group = a.group;
  d.window = windowOf(spatialOf(convIn), spatialOf(weight), spatialOf(convOut), a);
  return d;
}

// The three ways, as plain loops over the tap table.
void convForward(ConvDims& d, const Values& x, const Values& w, Values& y) {
  d.taps = windowTaps(d.window);
  const auto positions = static_cast<std::size_t>(d.window.outPositions());
  const auto inPositions = static_cast<std::size_t>(d.window.inPositions());
  const auto taps = static_cast<std::size_t>(d.window.taps());
  const auto cig = static_cast<std::size_t>(d.cInGroup());
  const auto cog = static_cast<std::size_t>(d.cOutGroup());
  for (std::size_t n = 0; n < static_cast<std::size_t>(d.batch); ++n) {
    for (std::size_t m = 0; m < static_cast<std::size_t>(d.cOut); ++m) {
      const std::size_t firstIn = (m / cog) * cig;
      for (std::size_t p = 0; p < positions; ++p) {
        double sum = 0.0;
        for (std::size_t c = 0; c < cig; ++c) {
          for (std::size_t k = 0; k < taps; ++k) {
            const int64_t at = d.taps[k * positions + p];
            if (at < 0) continue;
            sum += x[(n * static_cast<std::size_t>(d.cIn) + firstIn + c) * inPositions +
                     static_cast<std::size_t>(at)] *
                   w[(m * cig + c) * taps + k];
          }
        }
        y[(n * static_cast<std::size_t>(d.cOut) + m) * positions + p] = sum;
      }
    }
  }
}

// The conv input's gradient from the conv output's (ConvTranspose).
void convBackwardData(ConvDims& d, const Values& dy, const Values& w, Values& dx) {
  d.taps = windowTaps(d.window);
  const auto positions = static_cast<std::size_t>(d.window.outPositions());
  const auto inPositions = static_cast<std::size_t>(d.window.inPositions());
  const auto taps = static_cast<std::size_t>(d.window.taps());
  const auto cig = static_cast<std::size_t>(d.cInGroup());
  const auto cog = static_cast<std::size_t>(d.cOutGroup());
  std::fill(dx.begin(), dx.end(), 0.0);
  for (std::size_t n = 0; n < static_cast<std::size_t>(d.batch); ++n) {
    for (std::size_t m = 0; m < static_cast<std::size_t>(d.cOut); ++m) {
      const std::size_t firstIn = (m / cog) * cig;
      for (std::size_t p = 0; p < positions; ++p) {
        const double g = dy[(n * static_cast<std::size_t>(d.cOut) + m) * positions + p];
        for (std::size_t c = 0; c < cig; ++c) {
          for (std::size_t k = 0; k < taps; ++k) {
            const int64_t at = d.taps[k * positions + p];
            if (at < 0) continue;
            dx[(n * static_cast<std::size_t>(d.cIn) + firstIn + c) * inPositions +
               static_cast<std::size_t>(at)] += g * w[(m * cig + c) * taps + k];
          }
        }
      }
    }
  }
}

// The weight's gradient (ConvGradWeight).
void convBackwardWeight(ConvDims& d, const Values& dy, const Values& x, Values& dw) {
  d.taps = windowTaps(d.window);
  const auto positions = static_cast<std::size_t>(d.window.outPositions());
  const auto inPositions = static_cast<std::size_t>(d.window.inPositions());
  const auto taps = static_cast<std::size_t>(d.window.taps());
  const auto cig = static_cast<std::size_t>(d.cInGroup());
  const auto cog = static_cast<std::size_t>(d.cOutGroup());
  for (std::size_t m = 0; m < static_cast<std::size_t>(d.cOut); ++m) {
    const std::size_t firstIn = (m / cog) * cig;
    for (std::size_t c = 0; c < cig; ++c) {
      for (std::size_t k = 0; k < taps; ++k) {
        double sum = 0.0;
        for (std::size_t n = 0; n < static_cast<std::size_t>(d.batch); ++n) {
          for (std::size_t p = 0; p < positions; ++p) {
            const int64_t at = d.taps[k * positions + p];
            if (at < 0) continue;
            sum += dy[(n * static_cast<std::size_t>(d.cOut) + m) * positions + p] *
                   x[(n * static_cast<std::size_t>(d.cIn) + firstIn + c) * inPositions +
                     static_cast<std::size_t>(at)];
          }
        }
        dw[(m * cig + c) * taps + k] = sum;
      }
    }
  }
}

// Checks the weight [Co, Ci/group, K..] against the conv input's and
// output's channels.
void checkGroups(const OpChecker& c, int64_t group, int64_t cIn, int64_t cOut, const Shape& weight,
                 std::string_view weightName) {
  if (group < 1 || cIn % group != 0 || cOut % group != 0) {
    c.fail(ErrorCode::InvalidOperand,
           fmt::format("`group` {} must be >= 1 and divide both channel counts {} and {}", group, cIn, cOut));
  }
  if (weight[0] != cOut || weight[1] != cIn / group) {
    c.fail(ErrorCode::ShapeMismatch,
           fmt::format("the weight {} must be [{}, {}, K..] ({} channels in {} group(s) to {} channels)",
                       weightName, cOut, cIn / group, cIn, group, cOut));
  }
}

// Both inputs NC[D]HW of one spatial rank.
int64_t sameSpatialRank(const OpChecker& c) {
  const int64_t r = spatialRank(c, 0);
  if (c.rank(1) != c.rank(0)) {
    c.fail(ErrorCode::ShapeMismatch, fmt::format("inputs {} and {} must have the same rank ({} spatial axes)",
                                                 c.desc(0), c.desc(1), r));
  }
  return r;
}

// ConvTranspose's output extents.
Shape transposedExtent(const Shape& in, const Shape& kernel, const OpAttributes& a) {
  const std::size_t r = in.size();
  Shape out(r);
  for (std::size_t d = 0; d < r; ++d) {
    out[d] = (in[d] - 1) * a.strides[d] - a.pads[d] - a.pads[d + r] + a.dilations[d] * (kernel[d] - 1) + 1 +
             a.outputPadding[d];
  }
  return out;
}

// The outputPadding that makes ConvTranspose over `out` give back `in`.
std::vector<int64_t> paddingFor(const Shape& in, const Shape& out, const Shape& kernel,
                                const OpAttributes& a) {
  OpAttributes none = a;
  none.outputPadding.assign(in.size(), 0);
  const Shape base = transposedExtent(out, kernel, none);
  std::vector<int64_t> padding(in.size());
  for (std::size_t d = 0; d < in.size(); ++d) padding[d] = in[d] - base[d];
  return padding;
}

OpAttributes windowAttributes(const OpAttributes& a) {
  OpAttributes out;
  out.strides = a.strides;
  out.pads = a.pads;
  out.dilations = a.dilations;
  out.group = a.group;
  return out;
}

// The three ops' gradients, in the convolution's terms.
Tensor convOf(const GradientContext& g, Tensor in, Tensor weight) {
  return g.make(OpKind::Conv, {in.id(), weight.id()}, windowAttributes(g.attributes()));
}
Tensor transposeOf(const GradientContext& g, Tensor out, Tensor weight, const Shape& convIn) {
  OpAttributes a = windowAttributes(g.attributes());
  a.outputPadding = paddingFor(spatialOf(convIn), spatialOf(out.shape()), spatialOf(weight.shape()), a);
  return g.make(OpKind::ConvTranspose, {out.id(), weight.id()}, a);
}
Tensor weightOf(const GradientContext& g, Tensor out, Tensor in, const Shape& weight) {
  OpAttributes a = windowAttributes(g.attributes());
  a.shape = weight;
  return g.make(OpKind::ConvGradWeight, {out.id(), in.id()}, a);
}

}  // namespace

void addConvOps(OpTable& table) {
  table.add({.kind = OpKind::Conv,
             .family = OpFamily::Conv,
             .shape = [](const OpChecker& c, OpAttributes& a) -> std::vector<OutputSpec> {
               c.arity(2);
               const DType dtype = c.floating({0, 1});
               const int64_t r = sameSpatialRank(c);
               const Shape& x = c.shape(0);
               const Shape& w = c.shape(1);
               checkGroups(c, a.group, x[1], w[0], w, c.desc(1));
               normaliseWindow(c, a, r, spatialOf(w), WindowUse::Conv);
               Shape out{x[0], w[0]};
               const Shape spatial = windowOutput(c, spatialOf(x), spatialOf(w), a, false);
               out.insert(out.end(), spatial.begin(), spatial.end());
               return {{out, dtype, {}}};
             },
             .gradient = [](const GradientContext& g) -> std::vector<Tensor> {
               std::vector<Tensor> out{Tensor{}, Tensor{}};
               if (g.isWanted(0)) out[0] = transposeOf(g, g.dy, g.in(1), g.in(0).shape());
               if (g.isWanted(1)) out[1] = weightOf(g, g.dy, g.in(0), g.in(1).shape());
               return out;
             },
             .reference =
                 [](ReferenceOp& r, int64_t replica) {
                   ConvDims d = convDims(r.inShape(0), r.outShape(), r.inShape(1), r.attributes());
                   convForward(d, r.in(0, replica), r.in(1, replica), r.out(replica));
                 },
             .cost = [](const Graph& graph, const OpNode& op) -> OpCost {
               const ConvDims d =
                   convDims(graph.tensor(op.inputs[0]).shape, graph.tensor(op.outputs[0]).shape,
                            graph.tensor(op.inputs[1]).shape, op.attributes);
               return {.flops = 2.0 * d.macs()};
             }});

  table.add(
      {.kind = OpKind::ConvTranspose,
       .family = OpFamily::Conv,
       .shape = [](const OpChecker& c, OpAttributes& a) -> std::vector<OutputSpec> {
         c.arity(2);
         const DType dtype = c.floating({0, 1});
         const int64_t r = sameSpatialRank(c);
         const Shape& x = c.shape(0);
         const Shape& w = c.shape(1);
         if (a.group < 1) {
           c.fail(ErrorCode::InvalidOperand, fmt::format("`group` {} must be >= 1", a.group));
         }
         checkGroups(c, a.group, w[1] * a.group, x[1], w, c.desc(1));
         normaliseWindow(c, a, r, spatialOf(w), WindowUse::ConvTranspose);
         const Shape spatial = transposedExtent(spatialOf(x), spatialOf(w), a);
         for (int64_t e : spatial) {
           if (e < 1) {
             c.fail(ErrorCode::ShapeMismatch,
                    fmt::format("the output of input {} and weight {} would be {}: the pads {} are too large",
                                c.desc(0), c.desc(1), spatial, a.pads));
           }
         }
         Shape out{x[0], w[1] * a.group};
         out.insert(out.end(), spatial.begin(), spatial.end());
         return {{out, dtype, {}}};
       },
       .gradient = [](const GradientContext& g) -> std::vector<Tensor> {
         std::vector<Tensor> out{Tensor{}, Tensor{}};
         if (g.isWanted(0)) out[0] = convOf(g, g.dy, g.in(1));
         if (g.isWanted(1)) out[1] = weightOf(g, g.in(0), g.dy, g.in(1).shape());
         return out;
       },
       .reference =
           [](ReferenceOp& r, int64_t replica) {
             ConvDims d = convDims(r.outShape(), r.inShape(0), r.inShape(1), r.attributes());
             convBackwardData(d, r.in(0, replica), r.in(1, replica), r.out(replica));
           },
       .cost = [](const Graph& graph, const OpNode& op) -> OpCost {
         const ConvDims d = convDims(graph.tensor(op.outputs[0]).shape, graph.tensor(op.inputs[0]).shape,
                                     graph.tensor(op.inputs[1]).shape, op.attributes);
         return {.flops = 2.0 * d.macs()};
       }});

  table.add(
      {.kind = OpKind::ConvGradWeight,
       .family = OpFamily::Conv,
       .shape = [](const OpChecker& c, OpAttributes& a) -> std::vector<OutputSpec> {
         c.arity(2);
         const DType dtype = c.floating({0, 1});
         const int64_t r = sameSpatialRank(c);
         const Shape& dy = c.shape(0);
         const Shape& x = c.shape(1);
         if (static_cast<int64_t>(a.shape.size()) != r + 2) {
           c.fail(ErrorCode::InvalidOperand,
                  fmt::format("`shape` {} must be the weight's shape [{}, C/group, K..] ({} spatial axes)",
                              a.shape, dy[1], r));
         }
         numElements(a.shape);
         checkGroups(c, a.group, x[1], dy[1], a.shape, fmt::format("`shape` {}", a.shape));
         normaliseWindow(c, a, r, spatialOf(a.shape), WindowUse::Conv);
         const Shape spatial = windowOutput(c, spatialOf(x), spatialOf(a.shape), a, false);
         if (dy[0] != x[0] || spatialOf(dy) != spatial) {
           c.fail(ErrorCode::ShapeMismatch,
                  fmt::format("dy {} must be the output of a Conv of input {} with a weight of `shape` {}: "
                              "[{}, {}, {}]",
                              c.desc(0), c.desc(1), a.shape, x[0], dy[1], fmt::join(spatial, ", ")));
         }
         return {{a.shape, dtype, {}}};
       },
       .gradient = [](const GradientContext& g) -> std::vector<Tensor> {
         std::vector<Tensor> out{Tensor{}, Tensor{}};
         if (g.isWanted(0)) out[0] = convOf(g, g.in(1), g.dy);
         if (g.isWanted(1)) out[1] = transposeOf(g, g.in(0), g.dy, g.in(1).shape());
         return out;
       },
       .reference =
           [](ReferenceOp& r, int64_t replica) {
             ConvDims d = convDims(r.inShape(1), r.inShape(0), r.outShape(), r.attributes());
             convBackwardWeight(d, r.in(0, replica), r.in(1, replica), r.out(replica));
           },
       .cost = [](const Graph& graph, const OpNode& op) -> OpCost {
         const ConvDims d = convDims(graph.tensor(op.inputs[1]).shape, graph.tensor(op.inputs[0]).shape,
                                     graph.tensor(op.outputs[0]).shape, op.attributes);
         return {.flops = 2.0 * d.macs()};
       }});
}

}  // namespace tessera
