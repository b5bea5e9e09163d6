// `tessera onnx-test` over ONNX's node tests (Debian's libonnx-testdata) of
// the ops the importer maps: each must pass on the simulated device; what it
// does not support must be reported as such, never as a failure.
#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include <doctest/doctest.h>

#include "support/process.hpp"
#include "test_support.hpp"

namespace {

namespace fs = std::filesystem;

const fs::path kNodeTests = "/usr/share/libonnx-testdata/data/node";

using tessera::test::runCli;

std::vector<std::string> lines(const std::string& text) {
  std::vector<std::string> result;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) result.push_back(line);
  return result;
}

// One or more node tests of every op the importer claims.
const std::vector<std::string> kClaimed = {"test_add",
                                           "test_add_bcast",
                                           "test_sub_bcast",
                                           "test_mul_bcast",
                                           "test_div_bcast",
                                           "test_neg",
                                           "test_relu",
                                           "test_tanh",
                                           "test_sigmoid",
                                           "test_exp",
                                           "test_log",
                                           "test_sqrt",
                                           "test_identity",
                                           "test_dropout_default",
                                           "test_dropout_default_mask",
                                           "test_softmax_axis_0",
                                           "test_softmax_axis_1",
                                           "test_softmax_default_axis",
                                           "test_logsoftmax_axis_0",
                                           "test_logsoftmax_large_number",
                                           "test_reduce_sum_keepdims_random",
                                           "test_reduce_sum_do_not_keepdims_random",
                                           "test_reduce_sum_empty_axes_input_noop_random",
                                           "test_reduce_mean_keepdims_random",
                                           "test_reduce_mean_do_not_keepdims_random",
                                           "test_reshape_negative_dim",
                                           "test_reshape_zero_and_negative_dim",
                                           "test_flatten_axis2",
                                           "test_flatten_negative_axis1",
                                           "test_transpose_all_permutations_3",
                                           "test_transpose_default",
                                           "test_slice",
                                           "test_slice_negative_axes",
                                           "test_slice_end_out_of_bounds",
                                           "test_concat_3d_axis_negative_2",
                                           "test_expand_dim_changed",
                                           "test_unsqueeze_two_axes",
                                           "test_unsqueeze_unsorted_axes",
                                           "test_squeeze_negative_axes",
                                           "test_gemm_all_attributes",
                                           "test_gemm_transposeA",
                                           "test_gemm_default_vector_bias",
                                           "test_matmul_2d",
                                           "test_matmul_3d",
                                           "test_matmul_4d",
                                           "test_sce_mean",
                                           "test_sce_sum",
                                           "test_sce_mean_log_prob",
                                           "test_shape_start_1_end_negative_1",
                                           "test_size",
                                           "test_constant",
                                           "test_mvn_expanded",
                                           "test_abs",
                                           "test_sign",
                                           "test_erf",
                                           "test_reciprocal",
                                           "test_leakyrelu",
                                           "test_leakyrelu_default",
                                           "test_clip_default_inbounds",
                                           "test_clip",
                                           "test_clip_example",
                                           "test_clip_splitbounds",
                                           "test_clip_default_min",
                                           "test_pow",
                                           "test_pow_bcast_array",
                                           "test_pow_types_float32_int64",
                                           "test_gather_0",
                                           "test_gather_1",
                                           "test_gather_2d_indices",
                                           "test_gather_negative_indices",
                                           "test_gather_elements_0",
                                           "test_gather_elements_1",
                                           "test_gather_elements_negative_indices",
                                           "test_scatter_elements_with_axis",
                                           "test_scatter_elements_with_duplicate_indices",
                                           "test_scatter_elements_with_negative_indices",
                                           "test_scatter_elements_without_axis",
                                           "test_nllloss_NC_expanded",
                                           "test_layer_normalization_2d_axis0",
                                           "test_layer_normalization_3d_axis_negative_2_epsilon",
                                           "test_layer_normalization_4d_axis_negative_1",
                                           "test_split_variable_parts_2d",
                                           "test_split_equal_parts_default_axis",
                                           "test_tile",
                                           "test_tile_precomputed",
                                           "test_averagepool_1d_default",
                                           "test_averagepool_2d_ceil",
                                           "test_averagepool_2d_default",
                                           "test_averagepool_2d_pads",
                                           "test_averagepool_2d_pads_count_include_pad",
                                           "test_averagepool_2d_precomputed_pads",
                                           "test_averagepool_2d_precomputed_pads_count_include_pad",
                                           "test_averagepool_2d_precomputed_same_upper",
                                           "test_averagepool_2d_precomputed_strides",
                                           "test_averagepool_2d_same_lower",
                                           "test_averagepool_2d_same_upper",
                                           "test_averagepool_2d_strides",
                                           "test_averagepool_3d_default",
                                           "test_basic_conv_with_padding",
                                           "test_basic_conv_without_padding",
                                           "test_conv_with_autopad_same",
                                           "test_conv_with_strides_and_asymmetric_padding",
                                           "test_conv_with_strides_no_padding",
                                           "test_conv_with_strides_padding",
                                           "test_convtranspose",
                                           "test_convtranspose_1d",
                                           "test_convtranspose_3d",
                                           "test_convtranspose_autopad_same",
                                           "test_convtranspose_dilations",
                                           "test_convtranspose_kernel_shape",
                                           "test_convtranspose_output_shape",
                                           "test_convtranspose_pad",
                                           "test_convtranspose_pads",
                                           "test_maxpool_1d_default",
                                           "test_maxpool_2d_ceil",
                                           "test_maxpool_2d_default",
                                           "test_maxpool_2d_dilations",
                                           "test_maxpool_2d_pads",
                                           "test_maxpool_2d_precomputed_pads",
                                           "test_maxpool_2d_precomputed_same_upper",
                                           "test_maxpool_2d_precomputed_strides",
                                           "test_maxpool_2d_same_lower",
                                           "test_maxpool_2d_same_upper",
                                           "test_maxpool_2d_strides",
                                           "test_maxpool_3d_default",
                                           "test_where_example",
                                           "test_where_long_example",
                                           "test_greater_bcast",
                                           "test_less",
                                           "test_greater_equal_bcast",
                                           "test_less_equal",
                                           "test_sce_none",
                                           "test_sce_none_weights_log_prob",
                                           "test_sce_mean_weight_ii_3d",
                                           "test_sce_mean_no_weight_ii_4d_log_prob",
                                           "test_sce_NCd1d2d3_sum_weight_high_ii_log_prob",
                                           "test_sce_NCd1d2d3d4d5_none_no_weight_expanded",
                                           "test_nllloss_NC",
                                           "test_nllloss_NCd1_mean_weight_negative_ii",
                                           "test_nllloss_NCd1d2_with_weight_reduction_mean",
                                           "test_nllloss_NCd1d2d3d4d5_none_no_weight",
                                           "test_batchnorm_example",
                                           "test_batchnorm_epsilon",
                                           "test_batchnorm_example_training_mode",
                                           "test_batchnorm_epsilon_training_mode",
                                           "test_prelu_example",
                                           "test_prelu_broadcast",
                                           "test_max_example",
                                           "test_max_int32",
                                           "test_min_two_inputs",
                                           "test_max_float16",
                                           "test_min_float16",
                                           "test_cast_FLOAT_to_FLOAT16",
                                           "test_cast_FLOAT16_to_FLOAT",
                                           "test_cast_FLOAT16_to_DOUBLE",
                                           "test_cast_DOUBLE_to_FLOAT16",
                                           "test_castlike_FLOAT16_to_FLOAT_expanded",
                                           "test_castlike_FLOAT_to_FLOAT16_expanded",
                                           "test_sum_example",
                                           "test_mean_example",
                                           "test_constant_pad",
                                           "test_edge_pad",
                                           "test_reflect_pad",
                                           "test_gru_defaults",
                                           "test_gru_seq_length",
                                           "test_gru_with_initial_bias",
                                           "test_lstm_defaults",
                                           "test_lstm_with_initial_bias",
                                           "test_rnn_seq_length",
                                           "test_simple_rnn_defaults",
                                           "test_simple_rnn_with_initial_bias"};

TEST_CASE("every node test of a claimed op passes") {
  REQUIRE_MESSAGE(fs::is_directory(kNodeTests), "install libonnx-testdata (scripts/setup.sh does)");
  std::vector<std::string> args = {"onnx-test"};
  for (const std::string& name : kClaimed) args.push_back((kNodeTests / name).string());
  const auto result = runCli(args);
  INFO("stdout: ", result.out);
  INFO("stderr: ", result.err);
  CHECK(result.exitCode == 0);
  const std::vector<std::string> out = lines(result.out);
  REQUIRE(out.size() == kClaimed.size() + 1);
  for (std::size_t k = 0; k < kClaimed.size(); ++k) CHECK(out[k] == "PASS " + kClaimed[k]);
  CHECK(out.back() == "onnx tests: " + std::to_string(kClaimed.size()) + " passed, 0 failed, 0 unsupported");
}

// Runs `tessera onnx-test` over one folder of ONNX's test data and checks what holds for every
// folder: exit 0, no FAIL line, and a closing count that agrees with the PASS lines. `check` sees
// each line as well. Returns the number of tests that passed.
template <typename LineCheck>
int runFolder(const fs::path& folder, LineCheck check) {
  CAPTURE(folder.string());
  const auto result = runCli({"onnx-test", folder.string()});
  INFO("stderr: ", result.err);
  CHECK(result.exitCode == 0);
  const std::vector<std::string> out = lines(result.out);
  REQUIRE(!out.empty());
  int passed = 0;
  for (const std::string& line : out) {
    CAPTURE(line);
    if (line.rfind("PASS ", 0) == 0) ++passed;
    CHECK(line.rfind("FAIL ", 0) != 0);
    check(line);
  }
  CHECK(out.back().rfind("onnx tests: " + std::to_string(passed) + " passed, 0 failed, ", 0) == 0);
  return passed;
}

TEST_CASE("the whole node suite runs without a failure; unsupported tests say why") {
  REQUIRE(fs::is_directory(kNodeTests));
  const int passed = runFolder(kNodeTests, [](const std::string& line) {
    if (line.rfind("UNSUPPORTED test_maxpool_with_argmax_2d_precomputed_pads:", 0) == 0) {
      CHECK(line.find("[tessera.onnx.705]") != std::string::npos);
      CHECK(line.find("the Indices output \"z\" is not supported") != std::string::npos);
    }
    // A batch-first recurrence (layout 1) is refused as a recurrence the ops do not compute.
    if (line.rfind("UNSUPPORTED test_gru_batchwise:", 0) == 0) {
      CHECK(line.find("[tessera.onnx.721]") != std::string::npos);
      CHECK(line.find("attribute layout is 1") != std::string::npos);
    }
  });
  CHECK(passed >= static_cast<int>(kClaimed.size()));
  // Today's count (float16 tests included); it only goes up.
  CHECK(passed >= 478);
}

TEST_CASE("PyTorch's conformance folders run without a failure, old opsets upgraded on import") {
  // pytorch-converted and pytorch-operator are opset-6 exports (two of opset 12): each imports
  // through ONNX's version converter; double models compute in double (the Add tests of
  // pytorch-operator feed doubles beyond float32's range). The floors are today's counts; they
  // only go up.
  const fs::path data = kNodeTests.parent_path();
  const std::vector<std::pair<std::string, int>> folders = {
      {"pytorch-converted", 82}, {"pytorch-operator", 35}, {"simple", 6}};
  for (const auto& row : folders) {
    const int passed = runFolder(data / row.first, [](const std::string& line) {
      // No old model is refused for its opset: the converter takes each one (a node of
      // another domain, as simple's training ops, is refused for its domain).
      if (line.find("[tessera.onnx.703]") != std::string::npos)
        CHECK(line.find(": domain \"") != std::string::npos);
    });
    CHECK(passed >= row.second);
  }
}

TEST_CASE("a mismatch is a failure with the worst difference, and the exit code says so") {
  const tessera::test::TempDir dir;
  const fs::path test = dir.path() / "test_relu_wrong";
  fs::copy(kNodeTests / "test_relu", test, fs::copy_options::recursive);
  // Expect the input itself: Relu changes every negative element.
  fs::copy_file(test / "test_data_set_0" / "input_0.pb", test / "test_data_set_0" / "output_0.pb",
                fs::copy_options::overwrite_existing);
  const auto result = runCli({"onnx-test", test.string()});
  CHECK(result.exitCode == 1);
  const std::vector<std::string> out = lines(result.out);
  REQUIRE(out.size() == 2);
  CHECK(out[0].rfind("FAIL test_relu_wrong: test_data_set_0: worst difference ", 0) == 0);
  CHECK(out[1] == "onnx tests: 0 passed, 1 failed, 0 unsupported");
}

TEST_CASE("a path that is not a folder is an unreadable file") {
  const auto result = runCli({"onnx-test", "no/such/folder"});
  CHECK(result.exitCode == 2);
  CHECK(result.err.rfind("error: [tessera.io.601] no/such/folder: not a folder of ONNX tests", 0) == 0);
}

}  // namespace
