// fusedattn.hpp's tensor helpers: a shape of more than FUSEDATTN_MAX_DIMS dimensions (or a stride
// count that differs from the shape's) is refused with an exception naming the count, and the
// descriptor's arrays are never written past.
#include <gtest/gtest.h>

#include <string>

#include "fusedattn/fusedattn.hpp"

namespace {

bool Contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(CppHeader, MakeTensorRefusesFiveDimensions) {
  float data[1] = {};
  try {
    fusedattn::MakeTensor(data, FUSEDATTN_DTYPE_FLOAT32, {1, 2, 3, 4, 5}, {120, 60, 20, 5, 1});
    FAIL() << "a 5-d shape was accepted";
  } catch (const fusedattn::Error& e) {
    EXPECT_EQ(e.status(), FUSEDATTN_ERROR_INVALID_ARGUMENT);
    EXPECT_TRUE(Contains(e.what(), "5 dimensions")) << e.what();
    EXPECT_TRUE(Contains(e.what(), "at most 4")) << e.what();
  }
}

TEST(CppHeader, MakeContiguousTensorRefusesFiveDimensions) {
  float data[1] = {};
  try {
    fusedattn::MakeContiguousTensor(data, FUSEDATTN_DTYPE_FLOAT32, {1, 2, 3, 4, 5});
    FAIL() << "a 5-d shape was accepted";
  } catch (const fusedattn::Error& e) {
    EXPECT_EQ(e.status(), FUSEDATTN_ERROR_INVALID_ARGUMENT);
    EXPECT_TRUE(Contains(e.what(), "5 dimensions")) << e.what();
  }
}

TEST(CppHeader, MakeTensorRefusesStridesOfAnotherCount) {
  float data[1] = {};
  try {
    fusedattn::MakeTensor(data, FUSEDATTN_DTYPE_FLOAT32, {2, 3}, {3, 1, 1, 1, 1, 1});
    FAIL() << "6 strides for a 2-d shape were accepted";
  } catch (const fusedattn::Error& e) {
    EXPECT_TRUE(Contains(e.what(), "2 dimensions in the shape but 6 strides")) << e.what();
  }
}

TEST(CppHeader, FourDimensionsAndFewerStillWork) {
  float data[1] = {};
  fusedattn_tensor t =
      fusedattn::MakeContiguousTensor(data, FUSEDATTN_DTYPE_FLOAT32, {2, 3, 4, 5});
  EXPECT_EQ(t.ndim, 4);
  EXPECT_EQ(t.strides[0], 60);
  EXPECT_EQ(t.strides[3], 1);
  fusedattn_tensor u = fusedattn::MakeTensor(data, FUSEDATTN_DTYPE_FLOAT32, {7}, {1});
  EXPECT_EQ(u.ndim, 1);
  EXPECT_EQ(u.shape[0], 7);
}

}  // namespace
