// The recurrences' arithmetic, shared by the double-precision references
// (lib/ops/recurrence.cc, T = double) and the device's kernels
// (simdevice/ops/recurrence.cc, T = float), so that both compute the same
// formulas in the same order. The work is cut into independent pieces: one
// lane (a direction and a batch row) runs forward or back through time, one
// row of the weights' gradient sums over every step and batch row, one step
// and batch row of the input's gradient sums over the directions and gates.
// Each piece computes its values in a fixed order, whichever thread runs it.
//
// Layouts (row-major; ONNX's gate orders: Gru z, r, h; Lstm i, o, f, c):
//  x        [S, B, I]
//  weights  [D, G*H, L], L = I + H + 2: per gate row its input weights, its
//           recurrent weights, its input bias and its recurrent bias
//  initial  [D, B, C*H], C = 2 for Lstm (h, then c), else 1
//  states   [S+1, D, B, K*H]: at step t the channels of the cell (Rnn h; Gru
//           h, z, r, n, and hr = R_h h_prev + Rb_h (linearBeforeReset) or
//           R_h (r h_prev) + Rb_h; Lstm h, c, i, o, f, g); at S the initial
//           state (h, Lstm's c in channel 1, the rest zero)
//  dpre     [S+1, D, B, 2*G*H]: at step t the gradients of the gates' input
//           pre-activations (W x + Wb), then of their recurrent ones (what
//           multiplies R's operand and adds to Rb); at S the initial state's
//           gradient (h, then Lstm's c), the rest zero
#pragma once

#include <cmath>
#include <cstdint>

#include "tessera/lib/graph.hpp"

namespace tessera::recurrence {

constexpr int64_t gatesOf(OpKind cell) { return cell == OpKind::Gru ? 3 : cell == OpKind::Lstm ? 4 : 1; }
constexpr int64_t channelsOf(OpKind cell) { return cell == OpKind::Gru ? 5 : cell == OpKind::Lstm ? 6 : 1; }
constexpr int64_t stateChannelsOf(OpKind cell) { return cell == OpKind::Lstm ? 2 : 1; }
constexpr bool isCell(OpKind kind) {
  return kind == OpKind::Rnn || kind == OpKind::Gru || kind == OpKind::Lstm;
}

struct Geometry {
  OpKind cell = OpKind::Rnn;
  RecurrenceDirection direction = RecurrenceDirection::Forward;
  bool linearBeforeReset = false;
  int64_t seq = 0;
  int64_t dirs = 1;
  int64_t batch = 0;
  int64_t input = 0;
  int64_t hidden = 0;

  int64_t gates() const { return gatesOf(cell); }
  int64_t gateRows() const { return gates() * hidden; }
  int64_t channels() const { return channelsOf(cell); }
  int64_t row() const { return input + hidden + 2; }
  int64_t stateWidth() const { return channels() * hidden; }
  int64_t preWidth() const { return 2 * gateRows(); }
  int64_t lanes() const { return dirs * batch; }
  bool reversed(int64_t d) const {
    return direction == RecurrenceDirection::Reverse ||
           (direction == RecurrenceDirection::Bidirectional && d == 1);
  }
  // The time of step k of direction d, and the slot of the state before the step at time t.
  int64_t timeOf(int64_t d, int64_t k) const { return reversed(d) ? seq - 1 - k : k; }
  int64_t prevSlot(int64_t d, int64_t t) const {
    if (reversed(d)) return t == seq - 1 ? seq : t + 1;
    return t == 0 ? seq : t - 1;
  }
  int64_t stateAt(int64_t t, int64_t d, int64_t b) const {
    return ((t * dirs + d) * batch + b) * stateWidth();
  }
  int64_t preAt(int64_t t, int64_t d, int64_t b) const { return ((t * dirs + d) * batch + b) * preWidth(); }
};

template <class T>
T sigmoidOf(T x) {
  return T(1) / (T(1) + std::exp(-x));
}

// Lane (d, b) forward through time: fills its states, the initial one at
// slot S first. `pre` holds 2*G*H values.
template <class T>
void forwardLane(const Geometry& g, int64_t d, int64_t b, const T* x, const T* w, const T* initial, T* states,
                 T* pre) {
  const int64_t H = g.hidden, I = g.input, L = g.row(), GH = g.gateRows(), K = g.stateWidth();
  const bool lstm = g.cell == OpKind::Lstm;
  T* first = states + g.stateAt(g.seq, d, b);
  for (int64_t k = 0; k < K; ++k) first[k] = T(0);
  const T* init = initial + (d * g.batch + b) * stateChannelsOf(g.cell) * H;
  for (int64_t h = 0; h < H; ++h) first[h] = init[h];
  if (lstm)
    for (int64_t h = 0; h < H; ++h) first[H + h] = init[H + h];
  const T* wd = w + d * GH * L;
  T* a = pre;
  T* rr = pre + GH;
  // Gru without linearBeforeReset: R_h multiplies r h_prev, known after r.
  const int64_t direct = g.cell == OpKind::Gru && !g.linearBeforeReset ? 2 * H : GH;
  for (int64_t step = 0; step < g.seq; ++step) {
    const int64_t t = g.timeOf(d, step);
    T* cur = states + g.stateAt(t, d, b);
    const T* prev = states + g.stateAt(g.prevSlot(d, t), d, b);
    const T* xt = x + (t * g.batch + b) * I;
    for (int64_t j = 0; j < GH; ++j) {
      const T* wr = wd + j * L;
      T s = wr[I + H];
      for (int64_t i = 0; i < I; ++i) s += wr[i] * xt[i];
      a[j] = s;
      if (j < direct) {
        T q = wr[I + H + 1];
        for (int64_t h = 0; h < H; ++h) q += wr[I + h] * prev[h];
        rr[j] = q;
      }
    }
    if (g.cell == OpKind::Rnn) {
      for (int64_t h = 0; h < H; ++h) cur[h] = std::tanh(a[h] + rr[h]);
    } else if (g.cell == OpKind::Gru) {
      T* z = cur + H;
      T* r = cur + 2 * H;
      T* n = cur + 3 * H;
      T* hr = cur + 4 * H;
      for (int64_t h = 0; h < H; ++h) {
        z[h] = sigmoidOf(a[h] + rr[h]);
        r[h] = sigmoidOf(a[H + h] + rr[H + h]);
      }
      if (g.linearBeforeReset) {
        for (int64_t h = 0; h < H; ++h) hr[h] = rr[2 * H + h];
      } else {
        for (int64_t j = 0; j < H; ++j) {
          const T* wr = wd + (2 * H + j) * L;
          T q = wr[I + H + 1];
          for (int64_t h = 0; h < H; ++h) q += wr[I + h] * (r[h] * prev[h]);
          hr[j] = q;
        }
      }
      for (int64_t h = 0; h < H; ++h) {
        n[h] = std::tanh(a[2 * H + h] + (g.linearBeforeReset ? r[h] * hr[h] : hr[h]));
        cur[h] = (T(1) - z[h]) * n[h] + z[h] * prev[h];
      }
    } else {
      for (int64_t h = 0; h < H; ++h) {
        const T i = sigmoidOf(a[h] + rr[h]);
        const T o = sigmoidOf(a[H + h] + rr[H + h]);
        const T f = sigmoidOf(a[2 * H + h] + rr[2 * H + h]);
        const T c = std::tanh(a[3 * H + h] + rr[3 * H + h]);
        const T cell = f * prev[H + h] + i * c;
        cur[H + h] = cell;
        cur[2 * H + h] = i;
        cur[3 * H + h] = o;
        cur[4 * H + h] = f;
        cur[5 * H + h] = c;
        cur[h] = o * std::tanh(cell);
      }
    }
  }
}

// Lane (d, b) back through time: fills its dpre from the states' gradient.
// `work` holds 4*H values.
template <class T>
void backwardLane(const Geometry& g, int64_t d, int64_t b, const T* dstates, const T* states, const T* w,
                  T* dpre, T* work) {
  const int64_t H = g.hidden, I = g.input, L = g.row(), GH = g.gateRows();
  const T* wd = w + d * GH * L;
  T* dh = work;            // the gradient of the state before the step, carried back
  T* dc = work + H;        // Lstm's cell state's
  T* next = work + 2 * H;  // dh of the step before, being summed
  T* gate = work + 3 * H;  // Gru without linearBeforeReset: R_h^T of the candidate's gradient
  for (int64_t h = 0; h < 2 * H; ++h) work[h] = T(0);
  // sum_j R[j, .] dr[j] over the rows [from, to) into next.
  const auto recurrentInto = [&](const T* dr, int64_t from, int64_t to, T* into) {
    for (int64_t j = from; j < to; ++j) {
      const T* wr = wd + j * L + I;
      const T v = dr[j - from];
      for (int64_t h = 0; h < H; ++h) into[h] += wr[h] * v;
    }
  };
  for (int64_t step = g.seq - 1; step >= 0; --step) {
    const int64_t t = g.timeOf(d, step);
    const T* cur = states + g.stateAt(t, d, b);
    const T* prev = states + g.stateAt(g.prevSlot(d, t), d, b);
    const T* dcur = dstates + g.stateAt(t, d, b);
    T* dA = dpre + g.preAt(t, d, b);
    T* dR = dA + GH;
    for (int64_t h = 0; h < H; ++h) {
      dh[h] += dcur[h];
      next[h] = T(0);
    }
    if (g.cell == OpKind::Rnn) {
      for (int64_t h = 0; h < H; ++h) {
        dA[h] = dh[h] * (T(1) - cur[h] * cur[h]);
        dR[h] = dA[h];
      }
      recurrentInto(dR, 0, H, next);
    } else if (g.cell == OpKind::Gru) {
      const T* z = cur + H;
      const T* r = cur + 2 * H;
      const T* n = cur + 3 * H;
      const T* hr = cur + 4 * H;
      for (int64_t h = 0; h < H; ++h) {
        const T dz = dh[h] * (prev[h] - n[h]);
        dA[h] = dz * z[h] * (T(1) - z[h]);
        dA[2 * H + h] = dh[h] * (T(1) - z[h]) * (T(1) - n[h] * n[h]);
        next[h] = dh[h] * z[h];
      }
      if (g.linearBeforeReset) {
        for (int64_t h = 0; h < H; ++h) {
          const T dr = dA[2 * H + h] * hr[h];
          dA[H + h] = dr * r[h] * (T(1) - r[h]);
          dR[2 * H + h] = dA[2 * H + h] * r[h];
        }
        for (int64_t j = 0; j < 2 * H; ++j) dR[j] = dA[j];
        recurrentInto(dR, 0, GH, next);
      } else {
        for (int64_t h = 0; h < H; ++h) gate[h] = T(0);
        recurrentInto(dA + 2 * H, 2 * H, GH, gate);
        for (int64_t h = 0; h < H; ++h) {
          const T dr = gate[h] * prev[h];
          dA[H + h] = dr * r[h] * (T(1) - r[h]);
          dR[2 * H + h] = dA[2 * H + h];
        }
        for (int64_t j = 0; j < 2 * H; ++j) dR[j] = dA[j];
        recurrentInto(dR, 0, 2 * H, next);
        for (int64_t h = 0; h < H; ++h) next[h] += gate[h] * r[h];
      }
    } else {
      const T* dcurC = dcur + H;
      for (int64_t h = 0; h < H; ++h) {
        const T c = cur[H + h], i = cur[2 * H + h], o = cur[3 * H + h], f = cur[4 * H + h],
                gg = cur[5 * H + h];
        const T tc = std::tanh(c);
        const T dct = dc[h] + dcurC[h] + dh[h] * o * (T(1) - tc * tc);
        dA[h] = dct * gg * i * (T(1) - i);
        dA[H + h] = dh[h] * tc * o * (T(1) - o);
        dA[2 * H + h] = dct * prev[H + h] * f * (T(1) - f);
        dA[3 * H + h] = dct * i * (T(1) - gg * gg);
        dc[h] = dct * f;
      }
      for (int64_t j = 0; j < GH; ++j) dR[j] = dA[j];
      recurrentInto(dR, 0, GH, next);
    }
    for (int64_t h = 0; h < H; ++h) dh[h] = next[h];
  }
  // The initial state's gradient (what flows back through time, and any
  // gradient of the initial slot itself).
  T* first = dpre + g.preAt(g.seq, d, b);
  const T* dfirst = dstates + g.stateAt(g.seq, d, b);
  for (int64_t k = 0; k < g.preWidth(); ++k) first[k] = T(0);
  for (int64_t h = 0; h < H; ++h) first[h] = dh[h] + dfirst[h];
  if (g.cell == OpKind::Lstm)
    for (int64_t h = 0; h < H; ++h) first[H + h] = dc[h] + dfirst[H + h];
}

// Row j of direction d of the packed weights' gradient (L values): summed
// over the steps t = 0..S-1 and the batch rows in that order.
template <class T>
void weightGradRow(const Geometry& g, int64_t d, int64_t j, const T* dpre, const T* states, const T* x,
                   T* out) {
  const int64_t H = g.hidden, I = g.input, GH = g.gateRows();
  for (int64_t k = 0; k < g.row(); ++k) out[k] = T(0);
  // Gru's candidate rows without linearBeforeReset multiply r h_prev.
  const bool resetOperand = g.cell == OpKind::Gru && !g.linearBeforeReset && j >= 2 * H;
  for (int64_t t = 0; t < g.seq; ++t) {
    for (int64_t b = 0; b < g.batch; ++b) {
      const T* p = dpre + g.preAt(t, d, b);
      const T da = p[j];
      const T dr = p[GH + j];
      const T* xt = x + (t * g.batch + b) * I;
      const T* prev = states + g.stateAt(g.prevSlot(d, t), d, b);
      for (int64_t i = 0; i < I; ++i) out[i] += da * xt[i];
      if (resetOperand) {
        const T* r = states + g.stateAt(t, d, b) + 2 * H;
        for (int64_t h = 0; h < H; ++h) out[I + h] += dr * (r[h] * prev[h]);
      } else {
        for (int64_t h = 0; h < H; ++h) out[I + h] += dr * prev[h];
      }
      out[I + H] += da;
      out[I + H + 1] += dr;
    }
  }
}

// x's gradient at step t, batch row b (I values): summed over the
// directions, then the gate rows.
template <class T>
void inputGradRow(const Geometry& g, int64_t t, int64_t b, const T* dpre, const T* w, T* out) {
  const int64_t I = g.input, L = g.row(), GH = g.gateRows();
  for (int64_t i = 0; i < I; ++i) out[i] = T(0);
  for (int64_t d = 0; d < g.dirs; ++d) {
    const T* dA = dpre + g.preAt(t, d, b);
    const T* wd = w + d * GH * L;
    for (int64_t j = 0; j < GH; ++j) {
      const T v = dA[j];
      const T* wr = wd + j * L;
      for (int64_t i = 0; i < I; ++i) out[i] += wr[i] * v;
    }
  }
}

}  // namespace tessera::recurrence
