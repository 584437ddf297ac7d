#include <gtest/gtest.h>
#include "fusedattn/fusedattn.h"
TEST(Smoke, VersionIsReported) { EXPECT_EQ(fusedattn_version(), FUSEDATTN_VERSION); }
