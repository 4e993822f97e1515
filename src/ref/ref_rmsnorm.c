/* placeholder */
#include "ref/ref.h"
