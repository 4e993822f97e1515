#include "test_util.h"
void test_rmsnorm(void) {}
