#include "test_util.h"
void test_conv1d(void) {}
