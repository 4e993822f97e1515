/* placeholder */
#include "internal.h"
